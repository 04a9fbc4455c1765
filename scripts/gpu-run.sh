#!/usr/bin/env bash
# Runs optbench on an offline GPU runner from a copied work tree.
#
#   scripts/gpu-run.sh [optbench arguments]      (default: run --suite full)
#   scripts/gpu-run.sh pytest [pytest arguments]  (e.g. the pytest-benchmark twin, benchmarks/test_pytest_kernels.py)
#   scripts/gpu-run.sh each 'ARGS' 'ARGS' ...     several optbench commands in turn, one setup and one hand-back
#                                                 (each ARGS as a shell would split it; the worst exit status)
#
# With $OUT set (a lent machine's hand-back folder), results/ (optbench's records, and asv's own tree that
# asv.conf.json names, results/asv/) is packed into $OUT/results.tgz after the command; `optbench merge
# results.tgz` folds it into the checkout's results/.
#
# A copied work tree arrives with an empty .git: the history comes from .bundle/history.pack
# (made by `nox -s bundle`), so that asv can record results under the real commit hash. Python
# packages the runner lacks (asv and its requirements, liger-kernel) come from .wheelhouse/ (made by
# `nox -s wheelhouse`) and are installed into .cache/site without touching the system.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/restore-history.sh   # the history, from .bundle/ (a copied tree arrives without it)
if [ -n "$(git status --porcelain --untracked-files=no -- . ':!results')" ] && [ -z "${OPTBENCH_ALLOW_DIRTY:-}" ]; then
    echo "the work tree differs from $(git rev-parse --short HEAD): commit first (or set OPTBENCH_ALLOW_DIRTY=1)" >&2
    git status --short --untracked-files=no -- . ':!results' >&2
    exit 2
fi
git config user.email >/dev/null || git config user.email "runner@optbench.invalid"
git config user.name >/dev/null || git config user.name "optbench runner"

# Where a .wheelhouse/ is carried, .cache/site holds its wheels alone: installed afresh whenever their checksums
# differ from those it was installed from (.cache/site/.wheels), so a warm runner given another wheelhouse (one that
# left bitsandbytes or torchao out, or one for another CUDA under the same names) never runs the old one's packages.
wheels=$(cksum .wheelhouse/*.whl 2>/dev/null | sort -k3 || true)
if [ -n "$wheels" ] && [ "$wheels" != "$(cat .cache/site/.wheels 2>/dev/null)" ]; then
    rm -rf .cache/site
    python3 -m pip install -q --no-index --no-deps --no-compile --target .cache/site .wheelhouse/*.whl
    echo "$wheels" >.cache/site/.wheels
fi
[ -d .cache/site ] && export PYTHONPATH="$PWD/.cache/site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import asv, liger_kernel" 2>/dev/null \
    || { echo "asv or liger-kernel missing and not in .wheelhouse/: run 'nox -s wheelhouse'" >&2; exit 2; }
# The compile caches optbench's asv runs use (optbench.cli.bench_env), also for pytest: restored from a carried
# .compile-cache/<key>.tar.xz of this GPU, torch, Triton and CUDA where there is one (the run records 'restored <key>',
# 'cold', or 'local' on a warm machine that kept its own: optbench.run.compile_cache), packed again afterwards.
# Python's bytecode too: a runner image that ships no .pyc files and sets PYTHONDONTWRITEBYTECODE (the lent H100s
# do) compiles torch's modules again in every process (`import torch._dynamo` 7.9-10.0 s each time there), and a run
# has several (optbench's, asv's, each grid's). The first process writes the bytecode under .cache/pycache, the
# others read it; nothing outside the checkout changes.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX="$PWD/.cache/pycache" \
    TORCHINDUCTOR_CACHE_DIR="$PWD/.cache/inductor" TRITON_CACHE_DIR="$PWD/.cache/triton"
OPTBENCH_COMPILE_CACHE=$(python3 -m optbench.run.compile_cache restore)
export OPTBENCH_COMPILE_CACHE
echo "compile cache: $OPTBENCH_COMPILE_CACHE" >&2
[ $# -gt 0 ] || set -- run --suite full
each() {  # each argument an optbench command line: all run, the worst status is returned
    local worst=0 rc line
    for line in "$@"; do
        eval "set -- $line"
        echo "== optbench $line" >&2
        python3 -m optbench.cli "$@" && rc=0 || rc=$?
        [ "$rc" -gt "$worst" ] && worst=$rc
    done
    return "$worst"
}
case "$1" in
    pytest) shift; set -- python3 -m pytest "$@" ;;
    each) shift; set -- each "$@" ;;
    *) set -- python3 -m optbench.cli "$@" ;;
esac
if [ -n "${OUT:-}" ]; then
    # A lent machine hands back only $OUT, and not folders nested deeper than its limit: pack what the
    # command wrote in results/ (newer than the stamp; after every command, also a failed one) for
    # `optbench merge results.tgz` at home: not the copied store, most of a tgz that would pass the
    # 16 MiB a file may have to come back. Keep the output there too (gpu-run.log), so a call cut
    # off by its time limit still shows how far it got. With `run --time-budget S`, leave ~100 s of
    # the call's limit for this script's setup and the packing. ab's per-process logs
    # (.cache/ab/logs) come back as one file: $OUT takes 8 files at most.
    stamp=$(mktemp)
    hand_back() {  # each part whatever the one before did; the command's exit status stays
        local rc=$?
        set +e
        find results -type f -newer "$stamp" -print0 | tar czf "$OUT/results.tgz" --null -T -
        if [ -d .cache/ab/logs ]; then tar czf "$OUT/ab-logs.tgz" -C .cache/ab logs; fi
        python3 -m optbench.run.compile_cache pack --out "$OUT/compile-cache" >&2
        exit "$rc"
    }
    trap hand_back EXIT
    "$@" 2>&1 | tee -a "$OUT/gpu-run.log"
    exit "${PIPESTATUS[0]}"
else
    "$@"
fi
