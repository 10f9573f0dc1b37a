"""Stream audio through the pipeline at real time and check what comes back.

    python run.py                  # 60 s of audio, sent at real time (a chunk every 100 ms)
    python run.py --speed 0        # the same audio, as fast as it goes
    python run.py --seconds 5

The request is opened with ``input_stream=True``; each 100 ms chunk goes out when it would
have been recorded, and the filtered chunks come back while the input is still streaming.
The script checks the output against the same filter applied to the whole signal at once,
and prints how long each chunk took to come back. It exits 1 if the output is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np

import omnictl
from omnictl.outputs import AudioChunk, AudioResult

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # dsp.reference, the check

from dsp import SAMPLE_RATE, WINDOW, reference  # noqa: E402


def signal(seconds: float) -> np.ndarray:
    """A 440 Hz tone with noise on it: the low-pass keeps the tone and smooths the noise."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    noise = np.random.default_rng(0).standard_normal(t.size) * 0.1
    return (0.5 * np.sin(2 * np.pi * 440 * t) + noise).astype(np.float32)


async def stream(seconds: float, speed: float) -> int:
    audio = signal(seconds)
    period = WINDOW / SAMPLE_RATE / speed if speed > 0 else 0.0
    loop = asyncio.get_running_loop()
    launch = omnictl.Pipeline.launch(HERE / "topology.yaml", profile=False, request_timeout=seconds + 60)
    async with launch as pipe:
        request = await pipe.submit(None, input_stream=True)
        sent: list[float] = []  # when each chunk went out

        async def feed() -> float:
            start = loop.time()
            for index, offset in enumerate(range(0, audio.size, WINDOW)):
                # chunk `index` is complete (recorded) `index + 1` periods after the start
                await asyncio.sleep(max(0.0, start + (index + 1) * period - loop.time()))
                sent.append(loop.time())
                await request.send(AudioChunk(samples=audio[offset : offset + WINDOW], sample_rate=SAMPLE_RATE))
            await request.end_input()
            return loop.time()

        feeder = asyncio.create_task(feed())
        back: list[float] = []  # how long each filtered chunk took to come back
        during = 0  # chunks back before the input ended
        async for event in request.events():
            if event.kind is omnictl.RequestEventKind.STREAM:
                back.append(loop.time() - sent[len(back)])
                during += not feeder.done()
        ended = await feeder
        result = (await request.result())["lowpass"]
        finished = loop.time()
    assert isinstance(result, AudioResult)
    expected = reference(audio)
    ok = result.samples.shape == expected.shape and np.allclose(result.samples, expected, atol=1e-5)
    lag = np.array(back) * 1000
    print(
        f"streamed {seconds:g} s of audio in {ended - (sent[0] if sent else ended) + period:.1f} s "
        f"({len(sent)} chunks of {WINDOW / SAMPLE_RATE * 1000:g} ms); {len(back)} filtered chunks back, "
        f"{during} of them while the input was still streaming; the last {finished - ended:.2f} s after its end"
    )
    if back:
        print(
            f"chunk round trip (sent -> filtered chunk back): p50 {np.percentile(lag, 50):.1f} ms, "
            f"p99 {np.percentile(lag, 99):.1f} ms, max {lag.max():.1f} ms"
        )
    print("output matches the filter applied to the whole signal" if ok else "OUTPUT DIFFERS from the reference")
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of audio to stream (default 60)")
    parser.add_argument("--speed", type=float, default=1.0, help="times real time (0: as fast as it goes)")
    options = parser.parse_args()
    sys.exit(asyncio.run(stream(options.seconds, options.speed)))


if __name__ == "__main__":
    main()
