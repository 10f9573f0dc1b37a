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

    @pytest.mark.slow  # a five-node Ray cluster, and the voice assistant's real models in its actors
    @pytest.mark.timeout(1500)  # the whole module, run in the namespace (about a minute and a half, quiet)
    def test_ray_tests_in_a_loopback_only_network_namespace() -> None:
        unshare = shutil.which("unshare")
        assert unshare is not None and os.geteuid() == 0, \
            "the Ray tests need `unshare -n` as root (a loopback-only network namespace)"
        started = time.monotonic()
        inner = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
        result = subprocess.run([unshare, "-n", *inner], cwd=REPO, capture_output=True, text=True,
                                env={**os.environ, "OMNICTL_RAY_NETNS": "1", "OMNICTL_DATA_HOST": "127.0.0.1",
                                     "RAY_USAGE_STATS_ENABLED": "0"}, timeout=1440)
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

    from omnictl.exceptions import LaunchError, RequestFailed
    from tests.support import topo
    from tests.support.loop import LoopThread, launch
    from tests.support.rogue import assert_a_peer_without_the_keys_gets_nothing
    from tests.support.stages import seen

    # box-c is a rack of two machines: a process with two replicas there, each asking for all
    # of a machine's CPUs (`cpus: 2`), gets one replica on each.
    LABELS = ("box-a", "box-b", "box-c", "box-c")
    NODES = {"frontend": {"node": "box-a"}, "thinker": {"node": "box-b"}, "talker": {"node": "box-c"}}
    RACK = {"node": "box-c", "replicas": 2, "cpus": 2}

    @pytest.fixture(scope="module")
    def cluster() -> Iterator[Any]:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1"})
        nodes = [cluster.add_node(num_cpus=2, labels={"omnictl-node": label}, node_ip_address="127.0.0.1")
                 for label in LABELS]
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield cluster, nodes
        ray.shutdown()
        cluster.shutdown()

    def _label_of_node() -> dict[str, str | None]:
        return {n["NodeID"]: n["Labels"].get("omnictl-node") for n in ray.nodes() if n["Alive"]}

    def _node_of(handle: Any) -> str:
        return str(ray.get(handle.actor.node_id.remote(), timeout=60))

    def _assert_no_actor_left(launcher: Any) -> None:
        """Every actor this launch ever started is dead, in the GCS's own table (the state
        API proper needs the dashboard, which the test cluster does not run)."""
        from ray._private.state import actors

        ids = {handle.actor._actor_id.hex() for handle in launcher.started}
        deadline = time.monotonic() + 30  # ray.kill is asynchronous
        while time.monotonic() < deadline:
            left = {i: a["State"] for i, a in actors().items() if i in ids and a["State"] != "DEAD"}
            if not left:
                break
            time.sleep(0.2)
        assert not left, left
        assert ids and ids <= set(actors())

    def _run(loop: LoopThread, pipe: Any, inputs: dict[str, Any]) -> Any:
        async def one() -> Any:
            return await (await pipe.submit(inputs)).result()

        return loop.run(one(), timeout=120)

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
            nodes = _label_of_node()
            launcher = pipe._coordinator.launcher
            placed = {name: nodes[_node_of(h)] for name, h in launcher.handles.items()}
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
            deadline = time.monotonic() + 60  # generous: a loaded machine; done as soon as it holds
            while not _holds_nothing(stats := loop.run(pipe.stats())) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _holds_nothing(stats), stats
            assert all(entry["status"] == "up" for entry in stats.values()), stats
            assert stats["thinker"]["node"] == "box-b" and pipe.nodes()["box-c"]["status"] == "up"
            # every actor's profiling events reached the collector over tcp (CurveZMQ)
            assert pipe.profile.tcp_address.startswith("tcp://127.0.0.1:")
            # the collector stores batches as they come: on a loaded machine none may be on disk yet
            deadline = time.monotonic() + 60
            processes: set[str] = set()
            while time.monotonic() < deadline:
                rid = next((e.request_id for e in pipe.profile.store.iter_events() if e.request_id), None)
                processes = {e.process for e in pipe.profile.store.iter_events() if rid and e.request_id == rid}
                if processes >= {"frontend", "thinker", "talker"}:
                    break
                time.sleep(0.2)
            assert processes >= {"frontend", "thinker", "talker"}, processes
            tcp_hops = [e for e in pipe.profile.store.iter_events()
                        if e.kind.value == "hop_sent" and e.meta.get("transport") == "tcp"]
            assert tcp_hops and all(e.meta["bytes"] > 0 for e in tcp_hops)
            # a plain ZeroMQ socket (and one with a key of its own) at a Ray worker's data port
            for keys in ("none", "server-key-but-own-client-key"):
                assert_a_peer_without_the_keys_gets_nothing(loop, pipe, log, keys)
        finally:
            loop.run(pipe.close())
        assert not any(handle.alive() for handle in launcher.handles.values())
        _assert_no_actor_left(launcher)  # shutdown leaves no actor behind

    @pytest.mark.timeout(720)  # three real models loaded in Ray actors (its launch may wait 300 s + 60)
    def test_the_voice_assistant_answers_a_spoken_question_across_two_nodes(cluster: Any, loop: LoopThread,
                                                                            tmp_path: Path) -> None:
        import yaml

        from omnictl.models.voice_assistant.asr import SpeechRecognizer, whisper_base_dir
        from omnictl.models.voice_assistant.llm import smollm2_checkpoint
        from benchmarks.eval.samples import sample_request
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
        assert "box-a, box-b, box-c" in message

    def _rack_pipeline(loop: LoopThread, tmp_path: Path, seconds: float, max_restarts: int) -> Any:
        """``front`` here, ``work`` with two replicas on the two box-c machines, one each."""
        path = topo.write(tmp_path / "rack.yaml", [
            {"name": "front", "factory": "omnictl.models.examples.identity", "next": "work"},
            {"name": "work", "factory": "omnictl.models.examples.sleep", "factory_args": {"seconds": seconds},
             "terminal": True},
        ], processes={"work": RACK})
        # replay_limit 0: these tests are about what a death costs without replays
        pipe = launch(loop, path, profile=False, launcher="ray", ready_timeout=240, max_restarts=max_restarts,
                      replay_limit=0)
        handles = pipe._coordinator.launcher.handles
        nodes = {_node_of(handles["work#0"]), _node_of(handles["work#1"])}
        labels = _label_of_node()
        assert len(nodes) == 2 and {labels[n] for n in nodes} == {"box-c"}  # one replica per machine
        return pipe

    def _held(loop: LoopThread, pipe: Any, count: int) -> tuple[list[Any], dict[str, list[str]]]:
        """Submit ``count`` requests; least-in-flight placement spreads them over the replicas.
        Returns them, and which replica holds which request ids."""
        async def submit() -> list[Any]:
            return [await pipe.submit({"text": f"r{i}"}, request_id=f"held-{i}") for i in range(count)]

        requests = loop.run(submit())
        placement = pipe._coordinator.placement
        held = {name: placement.holders(name) for name in ("work#0", "work#1")}
        assert all(len(ids) == count // 2 for ids in held.values()), held
        return requests, held

    def _outcomes(loop: LoopThread, requests: list[Any]) -> dict[str, Any]:
        """Request id -> its result, or the RequestFailed it raised."""
        async def settle(request: Any) -> Any:
            try:
                return await request.result()
            except RequestFailed as exc:
                return exc

        async def all_of() -> list[Any]:
            return list(await asyncio.gather(*(settle(r) for r in requests)))

        return {r.id: out for r, out in zip(requests, loop.run(all_of(), timeout=180))}

    def _assert_exactly(outcomes: dict[str, Any], failed: list[str], replica: str) -> None:
        """The requests ``replica`` held failed naming stage, replica and node; the others completed."""
        for request_id, out in outcomes.items():
            if request_id in failed:
                assert isinstance(out, RequestFailed), (request_id, out)
                message = str(out)
                assert "stage 'work'" in message and f"'{replica}'" in message and "'box-c'" in message, message
                assert "died" in message, message
            else:
                assert out == {"work": {"text": f"r{request_id.split('-')[1]}"}}, (request_id, out)

    def test_a_killed_replica_actor_fails_exactly_its_requests_and_is_relaunched_on_its_label(
            cluster: Any, loop: LoopThread, tmp_path: Path) -> None:
        pipe = _rack_pipeline(loop, tmp_path, seconds=3, max_restarts=1)
        launcher = pipe._coordinator.launcher
        try:
            requests, held = _held(loop, pipe, 4)
            first = launcher.handles["work#0"]
            first.kill()  # the actor dies (ray.kill): its OS process is gone
            outcomes = _outcomes(loop, requests)
            _assert_exactly(outcomes, held["work#0"], "work#0")
            # the replica on the other machine kept serving throughout; the killed one comes back
            deadline = time.monotonic() + 120
            while (launcher.handles["work#0"] is first or pipe.health()[0] != "ok") and time.monotonic() < deadline:
                time.sleep(0.2)
            again = launcher.handles["work#0"]
            assert again is not first and again.restarts == 1 and pipe.health()[0] == "ok", pipe.health()
            assert _label_of_node()[_node_of(again)] == "box-c"  # relaunched on a node with its label
            assert _run(loop, pipe, {"text": "after restart"}) == {"work": {"text": "after restart"}}
        finally:
            loop.run(pipe.close())
        _assert_no_actor_left(launcher)  # the killed actor's successor too

    def test_an_elastic_process_scales_up_an_actor_on_its_label_and_scale_down_removes_it(
            cluster: Any, loop: LoopThread, tmp_path: Path) -> None:
        from ray._private.state import actors

        elastic = {"node": "box-c", "cpus": 2, "replicas": {"min": 1, "max": 2, "queue": 1, "window": 0.5, "idle": 2}}
        path = topo.write(tmp_path / "elastic.yaml", [
            {"name": "front", "factory": "omnictl.models.examples.identity", "next": "work"},
            {"name": "work", "factory": "omnictl.models.examples.sleep", "factory_args": {"seconds": 0.2},
             "terminal": True},
        ], processes={"work": elastic})
        pipe = launch(loop, path, profile=False, launcher="ray", ready_timeout=240)
        launcher = pipe._coordinator.launcher
        try:
            assert set(launcher.handles) == {"front", "work#0"} and pipe.standby == {"work#1"}

            async def client(c: int) -> list[Any]:  # closed loop: the added replica takes new requests
                return [await (await pipe.submit({"text": f"{c}-{i}"})).result() for i in range(10)]

            async def flood() -> list[Any]:
                return [o for batch in await asyncio.gather(*(client(c) for c in range(4))) for o in batch]

            outputs = loop.run(flood(), timeout=180)
            assert len(outputs) == 40 and all(set(o) == {"work"} for o in outputs)
            assert pipe.scaling()["work"]["scaled_up"] == 1
            added = launcher.handles["work#1"]
            labels = _label_of_node()
            assert labels[_node_of(added)] == "box-c"  # on its label, the other box-c machine
            assert _node_of(added) != _node_of(launcher.handles["work#0"])
            deadline = time.monotonic() + 60  # calm: drained and removed after the idle window
            # the launcher forgets the actor before the coordinator puts the replica back in
            # standby (after retire's await): wait for both, the end of the removal
            while ("work#1" in launcher.handles or pipe.standby != {"work#1"}) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "work#1" not in launcher.handles and pipe.standby == {"work#1"}
            assert pipe.scaling()["work"] == {"replicas": 1, "scaled_up": 1, "scaled_down": 1}
            actor_id = added.actor._actor_id.hex()
            while actors().get(actor_id, {}).get("State") != "DEAD" and time.monotonic() < deadline:
                time.sleep(0.2)
            assert actors()[actor_id]["State"] == "DEAD"  # the actor is gone, not just forgotten
            assert _run(loop, pipe, {"text": "after"}) == {"work": {"text": "after"}}
        finally:
            loop.run(pipe.close())
        _assert_no_actor_left(launcher)

    def test_removing_a_node_fails_exactly_its_requests_naming_stage_replica_and_node(
            cluster: Any, loop: LoopThread, tmp_path: Path) -> None:
        """Last in the module: it takes one of box-c's machines away for good."""
        ray_cluster, nodes = cluster
        pipe = _rack_pipeline(loop, tmp_path, seconds=6, max_restarts=0)
        launcher = pipe._coordinator.launcher
        try:
            requests, held = _held(loop, pipe, 4)
            doomed = _node_of(launcher.handles["work#1"])
            node = next(n for n in nodes if n.node_id == doomed)
            ray_cluster.remove_node(node)
            outcomes = _outcomes(loop, requests)
            _assert_exactly(outcomes, held["work#1"], "work#1")
            assert pipe.health()[0] == "degraded" and "work#1" in pipe.health()[1]
            assert pipe.nodes()["box-c"]["status"] == "degraded"
            # the replica on the other machine keeps serving new requests
            assert _run(loop, pipe, {"text": "still here"}) == {"work": {"text": "still here"}}
        finally:
            loop.run(pipe.close())
        _assert_no_actor_left(launcher)
