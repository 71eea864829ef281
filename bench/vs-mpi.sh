#!/usr/bin/env bash
# Lazarus against MPICH: ping-pong latency and bandwidth on 2 ranks.
#
# Installs MPICH from Debian's packages when `mpicc.mpich` is missing, builds
# bench/mpi_pingpong.c with it, builds Lazarus, then alternates the two
# programs (MPICH, Lazarus, MPICH, Lazarus, ...) for --rounds rounds so that
# machine noise hits both alike. Each MPICH run measures every size --trials
# times; each Lazarus run is `lazarus bench pingpong --reps <trials>`. A
# figure is the median of all the samples of a size (rounds x trials), and the
# ratios are Lazarus/MPICH: latency at 8 B (target <= 2), bandwidth at 64 KiB,
# 1 MiB (target >= 0.7) and 4 MiB. Each round also gives its own ratio (of
# the two programs' medians in that round, which ran seconds apart): their
# median is the paired ratio, shown with a distribution-free 95% confidence
# interval from 6 rounds on (as `lazarus bench` does).
#
# Usage: bench/vs-mpi.sh [--rounds N] [--trials N] [--json FILE] [--check]
#   --rounds N   alternations of the two programs (default 6)
#   --trials N   samples per size in each run (default 3)
#   --json FILE  write the figures here (default target/vs-mpi.json)
#   --check      exit 1 when a target is missed
# Environment:
#   LAZARUS_BACKEND   Lazarus backend (default processes; when unset and the
#                     binary has no processes backend, threads, with a warning;
#                     mpi builds with `--features mpi`, on the same MPICH, with
#                     LAZARUS_MPIEXEC=mpiexec.mpich)
#   CARGO_TARGET_DIR  where cargo builds (default <repo>/target)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=6
TRIALS=3
JSON_OUT="$ROOT/target/vs-mpi.json"
CHECK=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
        --trials) TRIALS=${2:?--trials needs a number}; shift 2 ;;
        --json) JSON_OUT=${2:?--json needs a file}; shift 2 ;;
        --check) CHECK=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) echo "vs-mpi.sh: unknown option \`$1' (try --help)" >&2; exit 2 ;;
    esac
done
for v in "$ROUNDS" "$TRIALS"; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "vs-mpi.sh: \`$v' is not a positive count" >&2; exit 2; }
done

# 1. MPICH.
if ! command -v mpicc.mpich >/dev/null || ! command -v mpiexec.mpich >/dev/null; then
    echo "== installing MPICH (apt-get install mpich libmpich-dev)" >&2
    SUDO=()
    [[ $(id -u) -eq 0 ]] || SUDO=(sudo)
    "${SUDO[@]}" apt-get update
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y mpich libmpich-dev
fi

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK="$TARGET/vs-mpi"
mkdir -p "$WORK" "$(dirname "$JSON_OUT")"
rm -f "$WORK"/mpich-*.json "$WORK"/lazarus-*.json

echo "== building bench/mpi_pingpong.c with mpicc.mpich -O2" >&2
mpicc.mpich -O2 -o "$WORK/mpi_pingpong" "$ROOT/bench/mpi_pingpong.c"

# 2. Lazarus.
FEATURES=()
if [[ ${LAZARUS_BACKEND:-} == mpi ]]; then
    FEATURES=(--features mpi)
    export LAZARUS_MPIEXEC=${LAZARUS_MPIEXEC:-mpiexec.mpich}
fi
echo "== building Lazarus (cargo build --release ${FEATURES[*]:-})" >&2
(cd "$ROOT" && cargo build --release --quiet "${FEATURES[@]}")
LAZ="$TARGET/release/lazarus"

if [[ -n ${LAZARUS_BACKEND:-} ]]; then
    BACKEND=$LAZARUS_BACKEND
elif "$LAZ" run pingpong --ranks 2 --backend processes --size 8 --iterations 1 >/dev/null 2>&1; then
    BACKEND=processes
else
    echo "warning: this Lazarus has no working \`--backend processes'; using threads" \
         "(ranks share one address space, messages are not copied: not comparable to MPICH's processes)." \
         "Set LAZARUS_BACKEND to choose." >&2
    BACKEND=threads
fi

# 3. Alternate.
echo "== $ROUNDS rounds of MPICH then Lazarus (backend $BACKEND), $TRIALS samples per size each" >&2
for r in $(seq 1 "$ROUNDS"); do
    echo "   round $r/$ROUNDS: MPICH" >&2
    mpiexec.mpich -n 2 "$WORK/mpi_pingpong" "$TRIALS" > "$WORK/mpich-$r.json"
    echo "   round $r/$ROUNDS: Lazarus" >&2
    "$LAZ" bench pingpong --ranks 2 --protocols none --backend "$BACKEND" --reps "$TRIALS" \
        --json "$WORK/lazarus-$r.json" > "$WORK/lazarus-$r.log" 2>&1 \
        || { cat "$WORK/lazarus-$r.log" >&2; echo "vs-mpi.sh: lazarus bench failed" >&2; exit 1; }
done

# 4. Medians, table, JSON.
python3 - "$WORK" "$ROUNDS" "$BACKEND" "$JSON_OUT" "$CHECK" <<'EOF'
import json, math, statistics, sys

work, rounds, backend, out, check = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"

mpich = {}     # bytes -> one-way latency samples, us
lazarus = {}   # bytes -> one-way latency samples, us
by_round = {}  # (program, bytes) -> {round: median latency of that round, us}
library = ""
for r in range(1, rounds + 1):
    with open(f"{work}/mpich-{r}.json") as f:
        m = json.load(f)
    if not m["intact"]:
        sys.exit(f"vs-mpi.sh: MPICH round {r}: ping-pong data corrupted")
    library = " ".join(m["library"].split())
    for p in m["points"]:
        mpich.setdefault(p["bytes"], []).extend(p["latency_us_trials"])
        by_round.setdefault(("mpich", p["bytes"]), {})[r] = statistics.median(p["latency_us_trials"])
    with open(f"{work}/lazarus-{r}.json") as f:
        l = json.load(f)
    lazarus_version = l["lazarus_version"]
    (prot,) = [p for p in l["protocols"] if p["protocol"] == "none"]
    if not prot["verified_all"]:
        sys.exit(f"vs-mpi.sh: Lazarus round {r}: a run did not verify")
    this_round = {}
    for run in prot["runs"]:
        for p in run["metrics"]:
            lazarus.setdefault(p["bytes"], []).append(p["latency_us"])
            this_round.setdefault(p["bytes"], []).append(p["latency_us"])
    for b, v in this_round.items():
        by_round.setdefault(("lazarus", b), {})[r] = statistics.median(v)

def median_ci95(v):
    """[x_(k), x_(n+1-k)] for the largest k with 1 - 2 P(Bin(n, 1/2) <= k-1) >= 0.95
    (a distribution-free interval for the median); None under 6 values."""
    v, n = sorted(v), len(v)
    k, tail = 0, 0.0
    while k < n // 2:
        tail += math.comb(n, k) / 2 ** n  # P(Bin <= k)
        if 1 - 2 * tail < 0.95:
            break
        k += 1
    return [v[k - 1], v[n - k]] if k > 0 else None

def paired(b, what):
    """Lazarus/MPICH per round (of latency, or of bandwidth: its inverse):
    their median and its 95% interval."""
    lz, mp = by_round.get(("lazarus", b), {}), by_round.get(("mpich", b), {})
    if set(lz) != set(mp):
        sys.exit(f"vs-mpi.sh: {b} B measured in rounds {sorted(mp)} by MPICH but {sorted(lz)} by Lazarus")
    rs = [lz[r] / mp[r] if what == "latency" else mp[r] / lz[r] for r in sorted(lz)]
    return (statistics.median(rs) if rs else float("nan")), median_ci95(rs)

def figures(samples, b):
    lat = statistics.median(samples[b])
    return {"latency_us": lat, "bandwidth_gb_s": b / lat / 1e3, "samples": len(samples[b])}

def size_name(b):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
    return f"{b} B"

# (bytes, compared figure, target: ("<=", x) or (">=", x) or None)
KEY = [(8, "latency", ("<=", 2.0)), (65536, "bandwidth", None),
       (1 << 20, "bandwidth", (">=", 0.7)), (4 << 20, "bandwidth", None)]
missing = [b for b, _, _ in KEY if b not in mpich or b not in lazarus]
if missing:
    sys.exit(f"vs-mpi.sh: sizes {missing} missing from a report")

rows, all_met = [], True
for b, what, target in KEY:
    mp, lz = figures(mpich, b), figures(lazarus, b)
    ratio = (lz["latency_us"] / mp["latency_us"] if what == "latency"
             else lz["bandwidth_gb_s"] / mp["bandwidth_gb_s"])
    met = None
    if target:
        met = ratio <= target[1] if target[0] == "<=" else ratio >= target[1]
        all_met &= met
    paired_ratio, paired_ci95 = paired(b, what)
    rows.append({"bytes": b, "size": size_name(b), "mpich": mp, "lazarus": lz,
                 "ratio_of": what, "ratio": ratio,
                 "paired_ratio": paired_ratio, "paired_ratio_ci95": paired_ci95,
                 "target": f"{target[0]} {target[1]:g}" if target else None, "met": met})

common = sorted(set(mpich) & set(lazarus))
# Versioned as every report `lazarus --json` writes (tools::JSON_SCHEMA).
report = {
    "schema": 1, "lazarus_version": lazarus_version,
    "ranks": 2, "rounds": rounds, "mpich_library": library,
    "lazarus_backend": backend, "lazarus_protocol": "none",
    "ratio": "Lazarus/MPICH: of latency_us at 8 B (below 1 favours Lazarus), of bandwidth_gb_s elsewhere (above 1 favours Lazarus)",
    "key_sizes": rows,
    "all_sizes": [{"bytes": b, "mpich": figures(mpich, b), "lazarus": figures(lazarus, b)} for b in common],
    "targets_met": all_met,
}
with open(out, "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")

n = rows[0]["mpich"]["samples"]
print(f"Ping-pong on 2 ranks: {library} vs Lazarus (backend {backend}, protocol none)")
print(f"{rounds} alternating rounds; medians of {n} samples per size each; GB/s = 10^9 B/s")
print(f"{'size':>7} | {'MPICH us':>9} {'MPICH GB/s':>10} | {'Lazarus us':>10} {'Lazarus GB/s':>12} | {'Lazarus/MPICH':>18} {'paired (95% CI)':>22} {'target':>7}")
print("-" * 113)
for row in rows:
    mp, lz = row["mpich"], row["lazarus"]
    t = "" if row["target"] is None else f"{row['target']:>7} {'met' if row['met'] else 'MISSED'}"
    ratio = f"{'lat' if row['ratio_of'] == 'latency' else 'bw'} {row['ratio']:.2f}"
    ci = row["paired_ratio_ci95"]
    pr = f"{row['paired_ratio']:.2f}" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
    print(f"{row['size']:>7} | {mp['latency_us']:>9.2f} {mp['bandwidth_gb_s']:>10.3f} | "
          f"{lz['latency_us']:>10.2f} {lz['bandwidth_gb_s']:>12.3f} | {ratio:>18} {pr:>22} {t}")
print(f"targets {'met' if all_met else 'MISSED'}; figures in {out}")
if backend == "threads":
    print("note: the threads backend keeps both ranks in one process and passes buffers without a copy;"
          " only --backend processes is comparable with MPICH's two processes.")
sys.exit(1 if check and not all_met else 0)
EOF
