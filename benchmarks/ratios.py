"""Ratios of meshio to Monarch from one side-by-side run, against the targets.

Usage: python3 benchmarks/ratios.py results/monarch.json results/meshio.json
"""

import json
import sys


def main() -> None:
    monarch, meshio = (json.load(open(p)) for p in sys.argv[1:3])
    lat = meshio["latency"]["median_us"]["median"] / monarch["latency"]["median_us"]["median"]
    tput = meshio["throughput_cps"]["median"] / monarch["throughput_cps"]["median"]
    bc = meshio["broadcast4"]["median_us"]["median"] / monarch["broadcast4"]["median_us"]["median"]
    print()
    print("| ratio meshio / Monarch (same run) | value | target | met |")
    print("|---|---|---|---|")
    print(f"| latency median, int->int | {lat:.3f}x | <= 0.3x | {'yes' if lat <= 0.3 else 'NO'} |")
    print(f"| throughput, 1000 in flight | {tput:.1f}x | >= 4x | {'yes' if tput >= 4 else 'NO'} |")
    print(f"| call on 4 actors + gather | {bc:.3f}x | - | - |")


if __name__ == "__main__":
    main()
