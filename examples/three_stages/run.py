import asyncio

import omnictl

# The simplest way: one request, synchronously. Results are keyed by terminal stage.
result = omnictl.run("topology.yaml", {"text": "hi"})
print(result["detokenize"].text)


# The asyncio API: stream events as they come.
async def main() -> None:
    async with omnictl.Pipeline.launch("topology.yaml") as pipe:
        request = await pipe.submit({"text": "omni"})
        async for event in request.events():
            print(event.kind.value, event.stage, event.data.text)


asyncio.run(main())
