import asyncio

import omnictl

# The simplest way: one request, synchronously.
print(omnictl.run("topology.yaml", {"text": "hi"}))


# The asyncio API: stream events as they come.
async def main() -> None:
    async with omnictl.Pipeline.launch("topology.yaml") as pipe:
        request = await pipe.submit({"text": "omni"})
        async for event in request.events():
            print(event.kind, event.stage, event.data)


asyncio.run(main())
