"""The Ray launcher on a local multi-node Ray cluster (one cluster for the module).

Ray probes public addresses when it starts; these tests keep every packet on 127.0.0.1 by
running in a private network namespace with only loopback. Run plainly (``pytest``), this
module has one test: it re-runs the module under ``unshare -n`` (needs root, as CI has) and
passes iff every test passed there. Inside (``OMNICTL_RAY_NETNS=1``) the real tests run.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
INSIDE = os.environ.get("OMNICTL_RAY_NETNS") == "1"

if not INSIDE:

    def test_ray_tests_in_a_loopback_only_network_namespace() -> None:
        unshare = shutil.which("unshare")
        assert unshare is not None and os.geteuid() == 0, \
            "the Ray tests need `unshare -n` as root (a loopback-only network namespace)"
        started = time.monotonic()
        inner = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
        result = subprocess.run([unshare, "-n", *inner], cwd=REPO, capture_output=True, text=True,
                                env={**os.environ, "OMNICTL_RAY_NETNS": "1", "OMNICTL_DATA_HOST": "127.0.0.1",
                                     "RAY_USAGE_STATS_ENABLED": "0"}, timeout=900)
        summary = result.stdout.strip().splitlines()[-1:] or ["(no output)"]
        print(f"Ray tests in the namespace: {summary[0]} ({time.monotonic() - started:.0f} s wall)")
        assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]

else:
    import fcntl
    import socket
    import struct

    def _loopback_up() -> None:
        """A new network namespace has only `lo`, down: bring it up (what `ip link set lo up`
        does, without needing iproute2)."""
        get_flags, set_flags, up = 0x8913, 0x8914, 0x1  # SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            flags = struct.unpack("16sh", fcntl.ioctl(sock, get_flags, struct.pack("16sh", b"lo", 0)))[1]
            fcntl.ioctl(sock, set_flags, struct.pack("16sh", b"lo", flags | up))

    _loopback_up()

    import numpy as np
    import ray
    from ray.cluster_utils import Cluster

    import omnictl
    from omnictl.exceptions import LaunchError, RequestFailed
    from tests.support import topo
    from tests.support.loop import LoopThread, launch
    from tests.support.stages import seen

    LABELS = ("box-a", "box-b", "box-c", "box-d")  # box-d: removed by the fault test
    NODES = {"frontend": {"node": "box-a"}, "thinker": {"node": "box-b"}, "talker": {"node": "box-c"}}

    @pytest.fixture(scope="module")
    def cluster() -> Iterator[Any]:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1"})
        nodes = {label: cluster.add_node(num_cpus=2, labels={"omnictl-node": label}, node_ip_address="127.0.0.1")
                 for label in LABELS}
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield cluster, nodes
        ray.shutdown()
        cluster.shutdown()

    @pytest.fixture(scope="module")
    def loop() -> Iterator[LoopThread]:
        thread = LoopThread()
        yield thread
        thread.close()

    def _holds_nothing(stats: dict[str, dict[str, Any]]) -> bool:
        return all(not any(v for k, v in entry.items() if k not in ("status", "process", "replicas", "node"))
                   for entry in stats.values())

    def test_qwen_shaped_topology_across_three_labelled_nodes(cluster: Any, loop: LoopThread, tmp_path: Path) -> None:
        log = tmp_path / "seen.log"
        pipe = launch(loop, topo.qwen_shaped(tmp_path, log, NODES), device="cpu", profile=True,
                      run_dir=tmp_path / "run", launcher="ray", ready_timeout=240)
        try:
            nodes = {n["NodeID"]: n["Labels"].get("omnictl-node") for n in ray.nodes() if n["Alive"]}
            launcher = pipe._coordinator.launcher
            placed = {name: nodes[ray.get(h.actor.node_id.remote())] for name, h in launcher.handles.items()}
            assert placed == {"frontend": "box-a", "thinker": "box-b", "talker": "box-c"}

            async def run() -> tuple[list[Any], dict[str, Any], str]:
                request = await pipe.submit({"text": "hello", "tag": "r1"})
                events = [event async for event in request.events()]
                aborted = await pipe.submit({"text": "abort me", "tag": "r2"})
                await aborted.abort()
                after = await (await pipe.submit({"text": "world", "tag": "r3"})).result()
                return events, await request.result(), after["decode"].text

            events, result, after = loop.run(run(), timeout=120)
            assert result["decode"].text == "hello" and after == "world"
            codes = [sum(range(4 * i, 4 * i + 4)) for i in range(5)]
            expected = np.concatenate([np.full(8, c / 100.0, dtype=np.float32) for c in codes])
            np.testing.assert_allclose(result["code2wav"].samples, expected)
            text = [e for e in events if e.stage == "decode"]
            assert [e.kind for e in text] == ["stream"] * 5 + ["result"]
            assert "".join(e.data.text for e in text[:-1]) == "hello"
            assert {"preprocessing", "image_encoder", "audio_encoder", "thinker", "talker_ar"} <= set(seen(log))
            # the abort left no state on any node: every counter of every stage back to zero
            deadline = time.monotonic() + 15
            while not _holds_nothing(stats := loop.run(pipe.stats())) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _holds_nothing(stats), stats
            assert all(entry["status"] == "up" for entry in stats.values()), stats
            assert stats["thinker"]["node"] == "box-b" and pipe.nodes()["box-c"]["status"] == "up"
            # every actor's profiling events reached the collector over tcp (CurveZMQ)
            assert pipe.profile.tcp_address.startswith("tcp://127.0.0.1:")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                rid = next(e.request_id for e in pipe.profile.store.iter_events() if e.request_id)
                processes = {e.process for e in pipe.profile.store.iter_events() if e.request_id == rid}
                if processes >= {"frontend", "thinker", "talker"}:
                    break
                time.sleep(0.2)
            assert processes >= {"frontend", "thinker", "talker"}, processes
            tcp_hops = [e for e in pipe.profile.store.iter_events()
                        if e.kind.value == "hop_sent" and e.meta.get("transport") == "tcp"]
            assert tcp_hops and all(e.meta["bytes"] > 0 for e in tcp_hops)
        finally:
            loop.run(pipe.close())
        for handle in launcher.handles.values():  # shutdown leaves no actor behind
            assert not handle.alive()
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(handle.actor.node_id.remote(), timeout=60)

    def test_the_voice_assistant_answers_a_spoken_question_across_two_nodes(cluster: Any, loop: LoopThread,
                                                                            tmp_path: Path) -> None:
        import yaml

        from omnictl.models.voice_assistant.asr import SpeechRecognizer, whisper_base_dir
        from omnictl.models.voice_assistant.llm import smollm2_checkpoint
        from omnictl.models.voice_assistant.samples import sample_request
        from omnictl.outputs import AudioResult, TextResult
        from omnictl.topology.model import Transport

        smollm2_checkpoint()  # build the caches here, not inside a stage's ready timeout
        whisper_base_dir()
        spec = yaml.safe_load((REPO / "topologies" / "voice-assistant.yaml").read_text())
        spec["processes"] = {"frontend": {"node": "box-a"}, "llm": {"node": "box-a"}, "speech": {"node": "box-b"}}
        path = tmp_path / "voice.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        pipe = launch(loop, path, device="cpu", profile=False, launcher="ray", ready_timeout=300)
        try:
            assert pipe.topology.edge("thinker", "tts").transport is Transport.TCP  # ASR + LLM on box-a, TTS on box-b

            async def ask() -> dict[str, Any]:
                request = await pipe.submit(sample_request("capital_of_france", sampling={"max_tokens": 40}))
                return await request.result()

            result = loop.run(ask(), timeout=300)
        finally:
            loop.run(pipe.close())
        assert isinstance(result["decode"], TextResult) and "Paris" in result["decode"].text
        speech = result["tts"]
        assert isinstance(speech, AudioResult) and speech.samples.size > 0
        heard = SpeechRecognizer().transcribe(speech.samples, speech.sample_rate)
        assert "paris" in heard.lower(), heard

    def test_a_label_no_node_carries_fails_the_launch_naming_process_and_label(cluster: Any, loop: LoopThread,
                                                                               tmp_path: Path) -> None:
        path = topo.write(tmp_path / "t.yaml", [{"name": "a", "factory": "omnictl.models.examples.identity",
                                                 "terminal": True}], processes={"a": {"node": "gpu-rack"}})
        started = time.monotonic()
        with pytest.raises(LaunchError) as caught:
            launch(loop, path, profile=False, launcher="ray")
        assert time.monotonic() - started < 30  # at once, not after the ready timeout
        message = str(caught.value)
        assert "process 'a'" in message and "'gpu-rack'" in message
        assert "box-a, box-b, box-c, box-d" in message

    def test_a_killed_actor_is_relaunched_on_a_node_with_its_label(cluster: Any, loop: LoopThread,
                                                                   tmp_path: Path) -> None:
        path = topo.write(tmp_path / "restart.yaml", [
            {"name": "front", "factory": "omnictl.models.examples.identity", "next": "work"},
            {"name": "work", "factory": "omnictl.models.examples.identity", "terminal": True},
        ], processes={"work": {"node": "box-c"}})
        pipe = launch(loop, path, profile=False, launcher="ray", ready_timeout=240, max_restarts=1)
        try:
            launcher = pipe._coordinator.launcher
            first = launcher.handles["work"]
            first.kill()
            deadline = time.monotonic() + 120
            while (launcher.handles["work"] is first or pipe.health()[0] != "ok") and time.monotonic() < deadline:
                time.sleep(0.2)
            again = launcher.handles["work"]
            assert again is not first and again.restarts == 1 and pipe.health()[0] == "ok"
            labels = {n["NodeID"]: n["Labels"].get("omnictl-node") for n in ray.nodes() if n["Alive"]}
            assert labels[ray.get(again.actor.node_id.remote())] == "box-c"

            async def one() -> Any:
                return await (await pipe.submit({"text": "after restart"})).result()

            assert loop.run(one())["work"] == {"text": "after restart"}
        finally:
            loop.run(pipe.close())

    def test_removing_a_node_fails_the_requests_it_held_naming_stage_and_node(cluster: Any, loop: LoopThread,
                                                                              tmp_path: Path) -> None:
        ray_cluster, nodes = cluster
        path = topo.write(tmp_path / "slow.yaml", [
            {"name": "front", "factory": "omnictl.models.examples.identity", "next": "slow"},
            {"name": "slow", "factory": "omnictl.models.examples.sleep", "factory_args": {"seconds": 30},
             "terminal": True},
        ], processes={"slow": {"node": "box-d"}})
        pipe = launch(loop, path, profile=False, launcher="ray", ready_timeout=240)
        try:
            async def in_flight() -> Any:
                return await pipe.submit({"text": "held"})

            request = loop.run(in_flight())
            time.sleep(1.0)  # reached the slow stage
            ray_cluster.remove_node(nodes["box-d"])
            with pytest.raises(RequestFailed) as caught:
                loop.run(request.result(), timeout=120)
            message = str(caught.value)
            assert "'slow'" in message and "'box-d'" in message and "died" in message
            assert pipe.health()[0] == "down"
        finally:
            loop.run(pipe.close())
