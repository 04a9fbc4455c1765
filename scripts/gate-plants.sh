#!/usr/bin/env bash
# Makes the branches the gate's own checks measure, on top of BASE (default HEAD), without touching the
# checkout (a temporary worktree): plant/neutral (a comment in a kernel file), plant/slow (a copy of every
# SwiGLU row view, ~5% on the 1B best-kernels step, and ~8 ms of host work per item-synced step, a
# pure-Python loop that slows with the CPU as the step's own host work does: ~15% of the host-bound eager
# 100M step), plant/graph-memory (1 GiB more in the CUDA graph's pool of every graphed step: the memory
# class's case peak and resident bytes, which a graph replay's own per-call figure cannot see) and
# plant/bisect (four commits, the second the SwiGLU copy).
#
#   scripts/gate-plants.sh [BASE]
#   optbench ab BASE plant/slow --suite full --select '...'      # must exit 1
#   optbench ab BASE plant/neutral --suite full --select '...'   # must not exit 1
#   optbench ab BASE plant/slow plant/neutral ...                 # both in one job: head 1 exits 1, head 2 0
#   optbench ab BASE plant/graph-memory plant/neutral --select 'Step100M\|variant=best-kernels$' \
#       --require memory --min-rounds 2                           # head 1 exits 1 (memory), head 2 no memory change
#   optbench bisect BASE plant/bisect --suite full --select 'SwiGLU'  # must name bisect 2/4
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(git rev-parse "${1:-HEAD}")
tree=$(mktemp -d)/plants
git worktree add -q --detach "$tree" "$base"
trap 'git worktree remove --force "$tree"' EXIT
cd "$tree"
commit() { git -c user.email=dev@optbench.invalid -c user.name="optbench dev" commit -q -am "$1"; }
copy_rows() {
    sed -i 's|    return x.contiguous().view(-1, width)$|    return x.contiguous().view(-1, width).clone()  # plant: a defensive copy|' \
        kernels/swiglu.py
}
git checkout -q -B plant/neutral "$base"
sed -i 's|^def _rows(x: torch.Tensor, width: int) -> torch.Tensor:|# A neutral change for the gate'"'"'s own A/A check: this comment alone.\n&|' \
    kernels/swiglu.py
commit "plant (not for main): a comment in kernels/swiglu.py, the gate's neutral change"
git checkout -q -B plant/slow "$base"
copy_rows
python3 - <<'PY'
from pathlib import Path
p = Path("models/step.py")
old = "        self._losses.append(loss.item() if self.options.item_sync else loss)\n        return loss\n"
new = ("        self._losses.append(loss.item() if self.options.item_sync else loss)\n"
       "        if self.options.item_sync:  # plant: ~8 ms more host work per host-bound (eager) step\n"
       "            spin = 0\n            for i in range(130_000):\n                spin += i * i % 7\n"
       "        return loss\n")
text = p.read_text()
assert old in text, "models/step.py changed: update the plant"
p.write_text(text.replace(old, new, 1))
PY
commit "plant (not for main): a copy of every SwiGLU row view (kernels/swiglu.py) and ~8 ms of host work per item-synced step (models/step.py)"
git checkout -q -B plant/graph-memory "$base"
python3 - <<'PY'
from pathlib import Path
p = Path("models/step.py")
old = "        with self._matmul_precision(), torch.cuda.graph(self._graph):\n"
new = old + "            self._planted = torch.zeros(1 << 30, dtype=torch.uint8, device=self.device)\n"
text = p.read_text()
assert old in text, "models/step.py changed: update the plant"
p.write_text(text.replace(old, new, 1))
PY
commit "plant (not for main): a graphed step holds 1 GiB more in its graph's pool (models/step.py)"
git checkout -q -B plant/bisect "$base"
echo "# A neutral change for the gate's bisection check." >> kernels/rmsnorm.py
commit "plant (not for main): bisect 1/4, a comment in kernels/rmsnorm.py"
copy_rows
commit "plant (not for main): bisect 2/4, a copy of every SwiGLU row view"
echo "# A neutral change for the gate's bisection check." >> kernels/rope.py
commit "plant (not for main): bisect 3/4, a comment in kernels/rope.py"
echo "# A neutral change for the gate's bisection check." >> models/model.py
commit "plant (not for main): bisect 4/4, a comment in models/model.py"
git checkout -q --detach
echo "plant/neutral plant/slow plant/graph-memory plant/bisect made on ${base:0:12}"
