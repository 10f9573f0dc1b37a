#!/usr/bin/env bash
# The wheel works on its own: build the sdist, build the wheel from that sdist, install the
# wheel (not editable) into a fresh virtual environment, and from a directory outside the
# checkout run `omnictl --version`, `omnictl validate` on every shipped topology (and on the
# one the wheel carries), `omnictl serve --help`, and one request against a served example.
#   bash scripts/check_wheel.sh            (after scripts/setup.sh; .ci/run calls it)
#
# The fresh environment has no system site-packages and no omnictl but the wheel's. Its
# third-party packages are .venv's, reached through a .pth path line (no download, and the
# same versions the tests ran): a path line adds .venv's site-packages to sys.path after the
# environment's own, but its .pth files are not run, so the editable install's import hook
# (__editable__.omnictl-*.pth) stays off, and the check below fails if `import omnictl`
# finds any copy but the wheel's.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV_PY="$REPO/.venv/bin/python"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/omnictl-wheel.XXXXXX")"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then kill "$SERVER_PID"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
step() { echo "check_wheel: $*"; }

# 1. sdist with setuptools' PEP 517 hook (what `python -m build` calls), then the wheel built
#    from the unpacked sdist, so a file the sdist leaves out fails here. .venv's setuptools
#    (pyproject.toml's [build-system] needs >= 77) builds it: nothing is downloaded.
DIST="$WORK/dist"
mkdir -p "$DIST"
(cd "$REPO" && "$VENV_PY" -c 'import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])' "$DIST" >"$WORK/sdist.log" 2>&1) \
  || { cat "$WORK/sdist.log"; exit 1; }
SDIST="$(ls "$DIST"/omnictl-*.tar.gz)"
"$VENV_PY" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$DIST" "$SDIST"
WHEEL="$(ls "$DIST"/omnictl-*.whl)"
step "built $(basename "$SDIST") ($(du -k "$SDIST" | cut -f1) KiB) and $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"

# 2. What the wheel carries: the schema, the default topology, the samples, the playground,
#    py.typed and the licence; its metadata names the licence and the version.
"$VENV_PY" - "$WHEEL" "$REPO" <<'EOF'
import sys, zipfile
from email.parser import Parser
from pathlib import Path

wheel, repo = Path(sys.argv[1]), Path(sys.argv[2])
names = set(zipfile.ZipFile(wheel).namelist())
expected = ["omnictl/py.typed", "omnictl/data/topology.schema.json", "omnictl/data/voice-assistant.yaml"]
expected += [f"omnictl/data/samples/{p.name}" for p in sorted((repo / "omnictl/data/samples").iterdir())]
expected += [f"omnictl/serving/static/{p.name}" for p in sorted((repo / "omnictl/serving/static").iterdir()) if p.is_file()]
info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
expected.append(f"{info}/licenses/LICENSE")
missing = [name for name in expected if name not in names]
if missing:
    sys.exit(f"check_wheel: the wheel lacks {missing}")
meta = Parser().parsestr(zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode())
if meta["License-Expression"] != "Apache-2.0":
    sys.exit(f"check_wheel: the wheel's METADATA says License-Expression {meta['License-Expression']!r}")
print(f"check_wheel: the wheel carries {len(expected)} data files (schema, default topology, samples, playground, py.typed, LICENSE); "
      f"omnictl {meta['Version']}, {meta['License-Expression']}")
EOF

# 3. A fresh environment with the wheel, run from outside the checkout.
"$VENV_PY" -c 'import sys, venv; venv.create(sys.argv[1], with_pip=False)' "$WORK/env"
SITE="$("$WORK/env/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
DEPS="$("$VENV_PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
echo "$DEPS" >"$SITE/omnictl-check-deps.pth"
"$VENV_PY" -m pip --python "$WORK/env/bin/python" install --quiet --no-deps --no-index "$WHEEL"
OUTSIDE="$WORK/outside"
mkdir -p "$OUTSIDE"
cd "$OUTSIDE"
OMNICTL="$WORK/env/bin/omnictl"
WHERE="$("$WORK/env/bin/python" -c 'import omnictl; print(omnictl.__file__)')"
case "$WHERE" in
  "$SITE"/*) step "import omnictl: $WHERE (the wheel's)" ;;
  *) echo "check_wheel: import omnictl found $WHERE, not the wheel's copy under $SITE" >&2; exit 1 ;;
esac
VERSION="$("$OMNICTL" --version)"
[ "$VERSION" = "omnictl $("$WORK/env/bin/python" -c 'import importlib.metadata as m; print(m.version("omnictl"))')" ] \
  || { echo "check_wheel: omnictl --version says '$VERSION', the wheel's metadata another" >&2; exit 1; }
step "$VERSION"

# Every shipped topology (the repository's topologies/, their factories imported from the
# wheel) and the one inside the wheel, which `omnictl serve` runs when given none.
BUILTIN="$("$WORK/env/bin/python" -c 'import omnictl; print(omnictl.default_topology())')"
"$OMNICTL" validate --check-imports "$REPO"/topologies/*.yaml "$BUILTIN" >"$WORK/validate.log" \
  || { cat "$WORK/validate.log"; exit 1; }
step "$(tail -1 "$WORK/validate.log") (validate --check-imports: topologies/*.yaml and the wheel's $(basename "$BUILTIN"))"
"$OMNICTL" serve --help >"$WORK/serve-help.log" || { cat "$WORK/serve-help.log"; exit 1; }
grep -q -- "--max-in-flight" "$WORK/serve-help.log" || { echo "check_wheel: serve --help lacks its options" >&2; exit 1; }
step "serve --help: $(grep -c -- ' --' "$WORK/serve-help.log") option lines"

# One request: the parrot example (its own stage code beside its topology) served by the
# wheel's omnictl, asked through the OpenAI-compatible API.
cp -r "$REPO/examples/parrot" "$OUTSIDE/parrot"
"$OMNICTL" serve "$OUTSIDE/parrot/topology.yaml" --port 0 --no-dashboard --run-dir "$WORK/run" >"$WORK/serve.log" 2>&1 &
SERVER_PID=$!
"$WORK/env/bin/python" - "$WORK/serve.log" "$SERVER_PID" <<'EOF'
import os, re, signal, sys, time
from pathlib import Path

import httpx

log, pid = Path(sys.argv[1]), int(sys.argv[2])
deadline = time.monotonic() + 90
url = None
while url is None:
    found = re.search(r"listening on (http://\S+)", log.read_text())
    if found:
        url = found.group(1)
    elif time.monotonic() > deadline or not Path(f"/proc/{pid}").exists():
        sys.exit(f"check_wheel: omnictl serve did not become ready:\n{log.read_text()}")
    else:
        time.sleep(0.2)
body = {"model": "parrot", "modalities": ["text"], "messages": [{"role": "user", "content": "polly wants a cracker"}]}
answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
text = answer.json()["choices"][0]["message"]["content"] if answer.status_code == 200 else None
os.kill(pid, signal.SIGINT)
if text != "polly wants a cracker":
    sys.exit(f"check_wheel: POST {url}/v1/chat/completions: HTTP {answer.status_code} {answer.text[:300]}")
print(f"check_wheel: POST {url}/v1/chat/completions (examples/parrot, served from {os.getcwd()}): {text!r}")
EOF
wait "$SERVER_PID" || { echo "check_wheel: omnictl serve exited $? on Ctrl-C:" >&2; cat "$WORK/serve.log" >&2; exit 1; }
SERVER_PID=""
step "ok"
