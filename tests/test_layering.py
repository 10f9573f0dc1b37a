"""The allowed dependencies between omnictl's packages, checked on every import.

Imports are read statically as in ``tests/test_import_cycles.py`` (``ast`` over every
``.py`` file: an import inside a function counts, an ``importlib.import_module`` of a
literal name does). One under ``if TYPE_CHECKING:`` counts only for the rules marked
*types too*: a layer that names another's types still knows it. A broken rule fails naming
the import (``file:line``), what it imports and the rule.

The rules:

- **stage** (the stage IO shell) does not import the coordinator, the models or ZeroMQ (types
  too): the coordinator talks to it in messages, a model is a factory it is handed by name,
  and every socket belongs to the process's ``Endpoint`` (``omnictl/transports/endpoint.py``;
  the stage reads the coordinator's broadcasts through its ``Broadcasts``).
- **schedulers** do not import the models: a model brings its runner or scheduler to them,
  and registers its hooks by entry point (the vLLM plugin finds Qwen3-Omni's processor in
  the ``omnictl.vllm_processors`` group, which pyproject.toml fills).
- **topology** and **transports** do not import each other both ways: the topology (the
  YAML language) derives each edge's transport from the transports' registry, and the
  transports do not import the topology, not even for a type (types too: the kinds they
  implement live in ``omnictl/transports/kinds.py``, and an ``Endpoint`` is handed the plain
  ``WireLayout`` it reads, which ``Topology.wire_layout()`` makes).
- **one worker-thread lifecycle**: a ``Scheduler`` whose model calls run in a worker thread
  derives from ``WorkerScheduler`` (``omnictl/schedulers/worker.py``: the thread started and
  stopped with it, jobs in order) and starts no ``ThreadPoolExecutor`` of its own;
  ``OWN_WORKER_THREADS`` says why each exception stands.
- **features from the library**: Whisper's log-mel features come from faster-whisper's
  ``FeatureExtractor`` (``omnictl/serving/realtime/smart_turn.py``, as its Whisper computes
  them); no module builds a mel scale, a mel filter bank or an STFT window of its own.
- **uvicorn's private classes**: nothing imports ``uvicorn.protocols`` (uvicorn's private
  protocol classes) but the connection guard (``omnictl/serving/common/connections.py``, with
  uvicorn pinned and ``tests/serving/common/test_uvicorn_private_api.py`` checking what it uses).
- **profiling** opens no ZeroMQ socket of its own: sockets belong to ``omnictl/transports``.
- **serving** (the HTTP server) reaches the runtime only through its public API: the
  modules at the top of the package (``omnictl``, ``omnictl.pipeline``,
  ``omnictl.exceptions``, ``omnictl.messages``, ``omnictl.outputs``, ``omnictl.inputs``,
  ``omnictl.sampling``, …) and the packages that are no runtime internals (``omnictl.data``,
  the audio policy); never ``coordinator``, ``stage``, ``schedulers``, ``transports``,
  ``topology``, ``models`` or ``profiling`` directly.

``ALLOWED`` lists the imports that break a rule today on purpose, each with why; an entry
that no longer matches an import fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from tests.test_import_cycles import PACKAGE, ROOT, _is_dynamic_import, _runtime_nodes, module_name

RUNTIME_INTERNALS = ("coordinator", "stage", "schedulers", "transports", "topology", "models", "profiling")


@dataclass(frozen=True)
class Rule:
    source: str  # a package of omnictl ("omnictl.stage")
    forbidden: str  # what it must not import: a module prefix ("omnictl.models", "zmq")
    why: str
    types: bool = False  # types too: an import under `if TYPE_CHECKING:` breaks it as well

    def applies(self, module: str, target: str) -> bool:
        return _within(module, self.source) and _within(target, self.forbidden) and not _within(target, self.source)


RULES = (
    Rule("omnictl.stage", "omnictl.coordinator", "stage does not import the coordinator"),
    Rule("omnictl.stage", "omnictl.models", "stage does not import the models"),
    Rule(
        "omnictl.stage",
        "zmq",
        "stage knows its Endpoint, not the socket library, not even for a type (transports)",
        types=True,
    ),
    Rule("omnictl.schedulers", "omnictl.models", "schedulers do not import the models"),
    Rule(
        "omnictl.transports",
        "omnictl.topology",
        "transports do not import the topology, not even for a type: it imports them, and hands an Endpoint "
        "its WireLayout",
        types=True,
    ),
    Rule(
        "omnictl",
        "uvicorn.protocols",
        "uvicorn's protocol classes are private: only the connection guard uses them, pinned and checked",
    ),
    Rule("omnictl.profiling", "zmq", "profiling opens no socket: sockets belong to omnictl/transports"),
    *(
        Rule("omnictl.serving", f"omnictl.{internal}", "serving reaches the runtime only through the public API")
        for internal in RUNTIME_INTERNALS
    ),
)
STAGE_ZMQ = next(rule for rule in RULES if rule.source == "omnictl.stage" and rule.forbidden == "zmq")

# (importing module or package, imported module) -> why it may, for now.
ALLOWED: dict[tuple[str, str], str] = {
    # No public hook for a header timeout, eviction at the cap or a hang-up (connections.py says
    # why); pyproject.toml pins uvicorn and tests/serving/common/test_uvicorn_private_api.py checks.
    ("omnictl.serving.common.connections", "uvicorn.protocols.http.h11_impl"): "the connection guard",
    ("omnictl.serving.common.connections", "uvicorn.protocols.websockets.websockets_sansio_impl"): "the guard",
}


def _allowed(module: str, target: str) -> bool:
    return any(_within(module, source) and target == allowed for source, allowed in ALLOWED)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@dataclass(frozen=True)
class Use:
    module: str  # the importing module
    target: str  # the imported module, as written (a package's submodule when it is one)
    file: Path
    line: int
    typed: bool = False  # under `if TYPE_CHECKING:`: it never runs


def _nodes(tree: ast.AST) -> list[tuple[ast.AST, bool]]:
    """Every node, and whether it is under ``if TYPE_CHECKING:`` (``_runtime_nodes`` leaves those out)."""
    runtime = {id(node) for node in _runtime_nodes(tree)}
    return [(node, id(node) not in runtime) for node in ast.walk(tree)]


@functools.cache  # each file is parsed once however many tests read it
def uses_of(path: Path, this: str) -> list[Use]:
    """Every import in ``path``, of omnictl's modules and of third-party ones alike (``typed``:
    one under ``if TYPE_CHECKING:``)."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[Use] = []
    for node, typed in _nodes(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = this.split(".") if is_package else this.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if base.startswith("omnictl") else base for alias in node.names]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                targets = [name.value]
        found.extend(Use(this, target, path, node.lineno, typed) for target in targets)  # type: ignore[attr-defined]
    return found


def _resolved(target: str, modules: set[str]) -> str:
    """``from omnictl.x import name``: ``omnictl.x.name`` when that is a module, else ``omnictl.x``."""
    if not target.startswith("omnictl"):
        return target
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return target


def broken(files: list[tuple[Path, str]], modules: set[str]) -> list[str]:
    """Each import of ``files`` (path, module name) that breaks a rule and is not allowed,
    as ``file:line: module imports target (rule)``."""
    problems: list[str] = []
    for path, this in files:
        for use in uses_of(path, this):
            target = _resolved(use.target, modules)
            for rule in RULES:
                if use.typed and not rule.types:
                    continue
                if rule.applies(this, target) and not _allowed(this, target):
                    where = use.file.relative_to(ROOT) if use.file.is_relative_to(ROOT) else use.file
                    problem = f"{where}:{use.line}: {this} imports {target} ({rule.why})"
                    if problem not in problems:  # `from x import a, b`: one line, one problem
                        problems.append(problem)
    return sorted(problems, key=lambda problem: (problem.split(":")[0], int(problem.split(":")[1])))


@functools.cache  # both tests read the same files
def _package() -> tuple[list[tuple[Path, str]], set[str]]:
    files = [(path, module_name(path)) for path in sorted(PACKAGE.rglob("*.py"))]
    return files, {module for _, module in files}


def test_every_import_keeps_the_layers() -> None:
    problems = broken(*_package())
    assert not problems, "imports across the layers:\n" + "\n".join(problems)


def test_every_allowed_exception_is_still_an_import() -> None:
    files, modules = _package()
    present = {(module, _resolved(use.target, modules)) for path, module in files for use in uses_of(path, module)}
    stale = sorted(
        f"{source} -> {target}"
        for source, target in ALLOWED
        if not any(_within(module, source) and used == target for module, used in present)
    )
    assert not stale, "ALLOWED lists imports that no longer exist (remove them):\n" + "\n".join(stale)


def test_the_checker_names_the_file_the_line_and_the_rule(tmp_path: Path) -> None:
    stage = tmp_path / "omnictl" / "stage"
    stage.mkdir(parents=True)
    shell = stage / "shell.py"
    shell.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from omnictl.models import huge\n"
        "def f():\n    import zmq.asyncio\n    from omnictl.models import tiny\n"
        "    from omnictl.stage import other\n"
    )
    modules = {"omnictl.stage.shell", "omnictl.stage.other", "omnictl.models", "omnictl.models.tiny",
               "omnictl.models.huge"}
    found = {(u.target, u.line, u.typed) for u in uses_of(shell, "omnictl.stage.shell")}
    assert {("omnictl.models.huge", 3, True), ("zmq.asyncio", 5, False)} <= found
    problems = broken([(shell, "omnictl.stage.shell")], modules)
    assert problems == [  # a model named for a type only is no crossing for this rule: it never runs
        f"{shell}:5: omnictl.stage.shell imports zmq.asyncio ({STAGE_ZMQ.why})",
        f"{shell}:6: omnictl.stage.shell imports omnictl.models.tiny (stage does not import the models)",
    ]


def test_a_types_too_rule_counts_an_import_made_only_for_a_type(tmp_path: Path) -> None:
    worker = tmp_path / "omnictl" / "stage" / "worker.py"
    worker.parent.mkdir(parents=True)
    worker.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import zmq.asyncio\n")
    problems = broken([(worker, "omnictl.stage.worker")], {"omnictl.stage.worker"})
    assert problems == [f"{worker}:3: omnictl.stage.worker imports zmq.asyncio ({STAGE_ZMQ.why})"]


WORKER_RULE = (
    "a scheduler starts no worker thread of its own: it derives from WorkerScheduler (omnictl/schedulers/worker.py)"
)
# Modules whose Scheduler starts a ThreadPoolExecutor of its own -> why it may, for now.
OWN_WORKER_THREADS: dict[str, str] = {
    "omnictl.models.qwen3_omni.code2wav": "the loop awaits each vocoder call (run_in_executor), one at a time, "
    "in the playback deadline policy's order: no queue of jobs in arrival order",
}


def own_worker_threads(path: Path, this: str) -> list[str]:
    """Each ``ThreadPoolExecutor(...)`` made in a class that derives from ``Scheduler`` itself,
    as ``file:line: module.Class starts a worker thread of its own (rule)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", None) for base in cls.bases}
        if "Scheduler" not in bases:
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name == "ThreadPoolExecutor":
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    found.append(f"{where}:{node.lineno}: {this}.{cls.name} starts a worker thread of its own "
                                 f"({WORKER_RULE})")
    return found


def test_schedulers_share_one_worker_thread_lifecycle() -> None:
    files, _ = _package()
    problems = [problem for path, module in files if module not in OWN_WORKER_THREADS
                and module != "omnictl.schedulers.worker" for problem in own_worker_threads(path, module)]
    assert not problems, "worker threads of their own:\n" + "\n".join(problems)
    stale = sorted(module for path, module in files
                   if module in OWN_WORKER_THREADS and not own_worker_threads(path, module))
    missing = sorted(set(OWN_WORKER_THREADS) - {module for _, module in files})
    assert not stale + missing, "OWN_WORKER_THREADS lists modules that no longer start one (remove them): " + \
        ", ".join(stale + missing)


def test_the_worker_thread_check_names_the_class_and_the_line(tmp_path: Path) -> None:
    module = tmp_path / "mine.py"
    module.write_text("from concurrent import futures\nclass Mine(Scheduler):\n    def start(self):\n"
                      "        self.pool = futures.ThreadPoolExecutor(max_workers=1)\n"
                      "class Fine(WorkerScheduler):\n    pass\n")
    assert own_worker_threads(module, "omnictl.mine") == [
        f"{module}:4: omnictl.mine.Mine starts a worker thread of its own ({WORKER_RULE})"]


FEATURES_RULE = (
    "log-mel features come from faster-whisper's FeatureExtractor: no mel scale, filter bank or STFT window by hand"
)
_MEL_FUNCTION = re.compile(r"(hz.*mel|mel.*(hz|filter|bank))", re.IGNORECASE)
_WINDOWS = {"hanning", "hamming", "blackman", "hann", "get_window"}  # numpy's and scipy's STFT windows


def hand_made_features(path: Path, this: str) -> list[str]:
    """Each function named for a mel scale or filter bank, and each STFT window made, in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _MEL_FUNCTION.search(node.name):
            found.append(f"{where}:{node.lineno}: {this} defines {node.name} ({FEATURES_RULE})")
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in _WINDOWS:
                found.append(f"{where}:{node.lineno}: {this} makes a {name} window ({FEATURES_RULE})")
    return found


def test_log_mel_features_come_from_the_library() -> None:
    files, _ = _package()
    problems = [problem for path, module in files for problem in hand_made_features(path, module)]
    assert not problems, "features computed by hand:\n" + "\n".join(problems)


def test_the_features_check_names_a_filter_bank_and_a_window(tmp_path: Path) -> None:
    module = tmp_path / "turn.py"
    module.write_text("import numpy as np\ndef _hz_to_mel(f):\n    return f\ndef _mel_filters():\n    pass\n"
                      "def log_mel(x):\n    return np.hanning(401)[:-1] * x\ndef echo(x):\n    return np.fft.rfft(x)\n")
    assert hand_made_features(module, "omnictl.turn") == [
        f"{module}:2: omnictl.turn defines _hz_to_mel ({FEATURES_RULE})",
        f"{module}:4: omnictl.turn defines _mel_filters ({FEATURES_RULE})",
        f"{module}:7: omnictl.turn makes a hanning window ({FEATURES_RULE})",
    ]
