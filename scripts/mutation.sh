#!/usr/bin/env bash
# Mutation testing of the core packages against the fast unit tests (mutmut 3).
# Not run in CI: it takes minutes per package. Run by hand:
#
#   scripts/mutation.sh                      # stage coordinator topology transports
#   scripts/mutation.sh schedulers serving   # with their own unit tests too (package_tests)
#   scripts/mutation.sh stage topology       # some of them
#   scripts/mutation.sh topology:shape,derive  # only those modules of a package
#   scripts/mutation.sh serving:realtime/responses,realtime/session/*  # a subpackage's module, or all of one
#   MUTATION_CHILDREN=4 scripts/mutation.sh  # more parallel workers (default 2)
#   MUTATION_DESELECT="tests/x.py::test_y" scripts/mutation.sh stage  # leave out a test failing for its own reason
#   MUTATION_SAMPLE=0.2 scripts/mutation.sh serving
#       # a fixed sample of about a fifth of the mutants (by a hash of each one's name:
#       # every run and retest of the same code draws the same ones); the rate printed is
#       # the sample's, with its 95 % interval. The rest stay "not checked".
#   MUTATION_RETEST=/tmp/omnictl-mutation scripts/mutation.sh transports
#       # after adding tests: re-test only the mutants that run left alive (survived, no
#       # tests), keeping its kills; minutes instead of half an hour. Mutants it never
#       # judged (a run cut short) stay unjudged ("not checked"), unless
#       # MUTATION_RETEST_UNJUDGED=1: then they are run too.
#
# On 2 shared cores a package takes 2-10 minutes; all of topology (2200 mutants) takes
# over half an hour, so name its modules to spend less.
#
# Each package runs in its own scratch copy of the working tree (tracked and
# untracked, not ignored files), so the checkout is never mutated and a stale
# mutant can never be committed. mutmut mutates only omnictl/<package>/*.py and,
# for each mutant, runs only the fast unit tests that reach the mutated
# function. A per-package summary line is printed at the end, and the surviving
# mutants are listed with their diffs in $MUTATION_OUT/<package>.survivors
# (default: /tmp/omnictl-mutation); every mutant's verdict is kept in
# $MUTATION_OUT/<package>.meta/ for MUTATION_RETEST. A retest keeps the earlier kills
# and timeouts as they were: sound while tests were only added and the package's code
# did not change (a function whose code changed is re-tested whole: mutmut compares
# each function's hash).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python=${PYTHON:-$repo/.venv/bin/python}
[[ -x $python ]] || python=$(command -v python3)
# `lines`: the literals on the lines named, one mutant each, against the tests named.
# mutmut mutates function bodies only, so a bound held in a module-level constant (a limit,
# a cap, FFmpeg's open options) is out of its reach; this mode reaches exactly those lines:
#
#   scripts/mutation.sh lines omnictl/audio/bounds.py:5,9,29 omnictl/serving/chat/protocol.py:40-75 \
#       -- tests/serving/test_security_limits.py
#
# Each number becomes twice itself (a bound loosened) and half of itself (tightened; 0
# becomes 1), each string "" (an option removed), True/False the other; every mutant runs
# the tests named (`pytest -x`) in a scratch copy of the tree and is killed when they fail.
# Prints each survivor with its line, and "lines: K/N killed".
if [[ ${1:-} == lines ]]; then
    shift
    specs=()
    while [[ $# -gt 0 && $1 != -- ]]; do specs+=("$1"); shift; done
    [[ ${1:-} == -- && $# -gt 1 && ${#specs[@]} -gt 0 ]] || {
        echo "usage: scripts/mutation.sh lines FILE:LINES... -- TEST..." >&2
        exit 2
    }
    shift
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/omnictl-mutation-lines.XXXXXX")
    git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done \
        | tar --null -T - -cf - | tar -xf - -C "$scratch"
    status=0
    (cd "$scratch" && "$python" - "${specs[@]}" -- "$@" <<'PY') || status=$?
import io, subprocess, sys, tokenize
from pathlib import Path

args = sys.argv[1:]
specs, tests = args[: args.index("--")], args[args.index("--") + 1 :]


def lines_of(spec: str) -> tuple[Path, list[int]]:
    path, _, ranges = spec.rpartition(":")
    numbers: list[int] = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        numbers.extend(range(int(first), int(last or first) + 1))
    if not Path(path).is_file():
        sys.exit(f"no file {path}")
    return Path(path), numbers


def mutants(line: str) -> list[tuple[int, int, str]]:
    """(start, end, replacement) for each literal of ``line`` (comments and f-strings left)."""
    found = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return found  # a line continued from the one above: its literals read on their own
    indent = len(line) - len(line.lstrip())
    for token in tokens:
        start, end = indent + token.start[1], indent + token.end[1]
        text = token.string
        if token.type == tokenize.NUMBER:
            value = eval(text.replace("_", ""))  # a literal's own text
            looser = value * 2 if value else 1
            tighter = value // 2 if isinstance(value, int) else value / 2
            for new in {looser, tighter if value else 1}:
                found.append((start, end, repr(new)))
        elif token.type == tokenize.STRING and not text.lstrip("rbRB").startswith(("f", "F")) and text not in ('""', "''"):
            found.append((start, end, '""'))
        elif token.type == tokenize.NAME and text in ("True", "False"):
            found.append((start, end, "False" if text == "True" else "True"))
    return found


killed = total = 0
for spec in specs:
    path, numbers = lines_of(spec)
    original = path.read_text()
    source = original.splitlines(keepends=True)
    for number in numbers:
        line = source[number - 1]
        for start, end, new in mutants(line):
            mutated = line[:start] + new + line[end:]
            path.write_text("".join(source[: number - 1] + [mutated] + source[number:]))
            run = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                 "-o", "addopts=--import-mode=importlib", *tests],
                capture_output=True, text=True,
            )
            total += 1
            if run.returncode != 0:
                killed += 1
            else:
                print(f"survived {path}:{number}: {line.strip()}  ->  {mutated.strip()}")
    path.write_text(original)
print(f"lines: {killed}/{total} killed ({100.0 * killed / max(total, 1):.1f}%)")
sys.exit(0 if total else 1)
PY
    rm -rf "$scratch"
    exit $status
fi

# mutmut is not among the test extras (CI does not run this): install it beside omnictl.
"$python" -c "import mutmut" 2>/dev/null || {
    echo "mutmut is not installed for $python: $python -m pip install 'mutmut==3.8.1'" >&2
    exit 2
}
children=${MUTATION_CHILDREN:-2}
retest=${MUTATION_RETEST:-}
sample=${MUTATION_SAMPLE:-}
out=${MUTATION_OUT:-${TMPDIR:-/tmp}/omnictl-mutation}
mkdir -p "$out"
packages=("$@")
[[ ${#packages[@]} -gt 0 ]] || packages=(stage coordinator topology transports)

# The fast unit tests: no model, no HTTP server, no end-to-end pipeline.
# Everything in them together runs in about ten seconds.
fast_tests=(tests/stage tests/topology tests/transports tests/coordinator tests/test_recent.py)
# A package's own unit tests besides (the schedulers': a tiny in-memory model; serving's:
# those that run in the test process: a mutant in a server subprocess is out of reach;
# the coordinator's: two end-to-end files, for what only a running pipeline reaches).
declare -A package_tests=(
    [schedulers]="tests/schedulers"
    # the audio toolkit: its own tests, the WAV reader's callers, and the bounds' values
    [audio]="tests/audio tests/test_inputs.py tests/serving/transcriptions/test_audiofile.py
             tests/serving/test_security_limits.py"
    # the coordinator's autoscaler shell and replay run only under load or a killed replica:
    # these run a real pipeline whose coordinator is in the test process (seconds each)
    [coordinator]="tests/runtime/test_elastic.py tests/runtime/test_replay.py"
    [serving]="tests/serving/realtime tests/serving/chat/test_protocol.py tests/serving/chat/test_responses.py tests/serving/speech/test_audio.py
               tests/serving/transcriptions/test_audiofile.py tests/serving/speech/test_audio_codecs.py tests/serving/common/test_auth.py
               tests/serving/common/test_eventstream.py tests/serving/test_app_starting.py tests/serving/realtime/test_events.py
               tests/serving/realtime/test_conversation_bounds.py tests/serving/realtime/test_vad.py
               tests/serving/test_app_inputs.py tests/serving/test_app_routes.py tests/serving/common/test_request_checks.py
               tests/serving/test_audio_routes.py tests/serving/realtime/test_formats.py
               tests/serving/test_route_clients.py tests/serving/realtime/test_echo_guard.py
               tests/serving/realtime/test_session_events.py tests/serving/realtime/test_semantic_vad.py
               tests/serving/test_server.py tests/serving/realtime/test_websocket_route.py tests/serving/common/test_metrics.py
               tests/serving/test_voices_and_playground.py tests/serving/common/test_connections.py tests/serving/test_ready.py
               tests/serving/realtime/test_webrtc_session.py"
)

# One thread per test process: the runs are parallel already (MUTATION_CHILDREN), and a
# thread pool started before a fork is what deadlocks after it.
# Packages whose selection names a whole folder take its fast tests only: its slow ones start
# servers and models, seconds per mutant.
declare -A package_fast_only=([serving]=1)

export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

summary=()
for arg in "${packages[@]}"; do
    pkg=${arg%%:*}
    [[ -d omnictl/$pkg ]] || { echo "no package omnictl/$pkg" >&2; exit 2; }
    only=("omnictl/$pkg/*")
    if [[ $arg == *:* ]]; then
        IFS=, read -r -a modules <<<"${arg#*:}"
        only=()
        for module in "${modules[@]}"; do
            if [[ $module == */\* ]]; then  # every module of a subpackage: realtime/*
                [[ -d omnictl/$pkg/${module%/\*} ]] || { echo "no subpackage omnictl/$pkg/${module%/\*}" >&2; exit 2; }
                only+=("omnictl/$pkg/$module")
                continue
            fi
            [[ -f omnictl/$pkg/$module.py ]] || { echo "no module omnictl/$pkg/$module.py" >&2; exit 2; }
            only+=("omnictl/$pkg/$module.py")
        done
    fi
    # Output files: topology-shape-derive.log for topology:shape,derive, and
    # serving-realtime.responses-realtime.session.all.log for serving:realtime/responses,realtime/session/*.
    name=${arg//\*/all}
    name=${name//\//.}
    name=${name//[:,]/-}
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/omnictl-mutation-$name.XXXXXX")
    scratch_started=$(mktemp "${TMPDIR:-/tmp}/omnictl-mutation-started.XXXXXX")  # a timestamp
    git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done \
        | tar --null -T - -cf - | tar -xf - -C "$scratch"
    {
        echo "[mutmut]"
        echo "source_paths = omnictl"
        echo "only_mutate ="
        printf '    %s\n' "${only[@]}"
        # Tests read the example topologies and the README from the tree.
        echo "also_copy ="
        for f in *; do [[ $f == omnictl || $f == tests ]] || echo "    $f"; done
        echo "pytest_add_cli_args_test_selection ="
        printf '    %s\n' "${fast_tests[@]}" ${package_tests[$pkg]:-}
        # pytest-timeout would fight mutmut's own timeout; the cache is noise. The two
        # tests that start a real pipeline are end-to-end: a mutant that breaks the
        # stage processes would only make them wait for their deadline. The CLI run
        # from the example's folder cannot work here: mutated code in that process
        # looks for mutmut's configuration in its working directory.
        echo "pytest_add_cli_args ="
        echo "    -p no:cacheprovider"
        echo "    -p no:timeout"
        echo "    -q"
        if [[ -n ${package_fast_only[$pkg]:-} ]]; then
            echo "    -m"
            echo "    not slow"
        fi
        echo "    --deselect=tests/topology/test_imports.py::test_a_launched_pipeline_imports_user_code_beside_its_topology"
        echo "    --deselect=tests/topology/test_imports.py::test_a_launch_whose_factory_is_missing_says_which_module_from_where_and_why"
        echo "    --deselect=tests/topology/test_imports.py::test_validate_check_imports_accepts_the_three_stage_example[from-its-folder]"
        # MUTATION_DESELECT="NODEID ...": tests left out besides (one failing in the tree for
        # a reason of its own stops mutmut before any mutant: its first run must pass)
        for nodeid in ${MUTATION_DESELECT:-}; do echo "    --deselect=$nodeid"; done
        # A mutant that hangs is a "timeout" (mutmut counts it as killed) after
        # 3 x (the tests' own time + 10 s). The 10 s matter on a shared machine: with
        # mutmut's default of 1 s, tests merely slowed by other load were called
        # timeouts, and the kill rate counted mutants that nothing caught.
        echo "timeout_multiplier = 3.0"
        echo "timeout_constant = 10.0"
        # Mutants run in processes forked from a server that has only collected the
        # tests: forked from mutmut's main process, which ran torch code, a forked
        # child could deadlock in torch's thread pool and pass for a "timeout".
        echo "process_isolation = forkserver"
    } >"$scratch/setup.cfg"
    names=()  # none: every mutant not judged yet
    if [[ -n $sample ]]; then
        # Generate the mutants and collect which tests reach each function, without running
        # one: mutmut does both before it looks for the mutants named, and a name that
        # matches none stops it there (an assertion, its exit status 1).
        echo "== omnictl/$arg: generating the mutants to draw a sample of $sample of them"
        (cd "$scratch" && "$python" -m mutmut run --max-children "$children" 'omnictl.no-such-mutant') \
            >"$out/$name.generate.log" 2>&1 || true
        [[ -f $scratch/mutants/mutmut-stats.json ]] || {
            echo "mutmut did not generate omnictl/$pkg's mutants; see $out/$name.generate.log" >&2
            tail -20 "$out/$name.generate.log" >&2
            exit 1
        }
        "$python" scripts/mutation_summary.py sample "$sample" "$scratch/mutants" >"$scratch/sample.names"
    fi
    if [[ -n $retest ]]; then
        [[ -d $retest/$name.meta ]] || { echo "no earlier verdicts in $retest/$name.meta" >&2; exit 2; }
        "$python" scripts/mutation_summary.py reopen "$retest/$name.meta" "$scratch/mutants" \
            ${MUTATION_RETEST_UNJUDGED:+--unjudged} >"$scratch/retest.names"
        if [[ -n $sample ]]; then  # only the sample's: the rest were never judged
            sort "$scratch/retest.names" | comm -12 - <(sort "$scratch/sample.names") >"$scratch/retest.sampled"
            mv "$scratch/retest.sampled" "$scratch/retest.names"
        fi
        mapfile -t names <"$scratch/retest.names"
        echo "== re-testing the ${#names[@]} mutants $retest/$name.meta left alive; its other verdicts stand"
        [[ ${#names[@]} -gt 0 ]] || { rm -rf "$scratch" "$scratch_started"; continue; }
    fi
    [[ -z $sample || -n $retest ]] || mapfile -t names <"$scratch/sample.names"
    echo "== omnictl/$arg (scratch copy: $scratch)"
    start=$SECONDS
    (cd "$scratch" && "$python" -m mutmut run --max-children "$children" "${names[@]}") >"$out/$name.log" 2>&1 || {
        echo "mutmut failed on omnictl/$pkg; see $out/$name.log" >&2
        tail -20 "$out/$name.log" >&2
        exit 1
    }
    (cd "$scratch" && "$python" -m mutmut results --all true) >"$out/$name.results" 2>&1 || true
    # Every mutant that the tests ran against and did not catch, with its diff, to judge
    # one by one ("no tests" mutants are in $name.results: no fast test reaches them).
    (cd "$scratch" && "$python" "$repo/scripts/mutation_summary.py" survivors) >"$out/$name.survivors" 2>&1 || true
    rm -rf "$out/$name.meta"
    (cd "$scratch/mutants" && find omnictl -name '*.meta' -print0 | tar --null -T - -cf -) \
        | (mkdir -p "$out/$name.meta" && tar -xf - -C "$out/$name.meta")
    line=$("$python" scripts/mutation_summary.py summary "$arg" "$out/$name.results" $((SECONDS - start)) $sample)
    echo "$line"
    summary+=("$line")
    rm -rf "$scratch"
    # A mutant killed mid-test (a timeout) cannot unlink its shared-memory segments:
    # remove the ones this run left whose owner process is gone.
    for seg in /dev/shm/omx*_*; do
        [[ -e $seg && $seg -nt $scratch_started ]] || continue
        owner=${seg#/dev/shm/omx}; owner=${owner%%_*}
        kill -0 "$owner" 2>/dev/null || rm -f "$seg"
    done
    rm -f "$scratch_started"
done
echo
echo "== kill rate per package (killed + timeout) / all mutants"
printf '%s\n' "${summary[@]}"
