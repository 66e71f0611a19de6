"""The rig's drives as llama.cpp's users would set them up: striped into one volume (issue [22]'s fair setup).

    python -m bench.peer_striped up --home HOME [--count 4] [--size-mib 1024]
    python -m bench.peer_striped down --home HOME

`up` makes `--count` more loop devices (sparse images, direct I/O, as the rig's), builds one btrfs over them with
data striped (`-d raid0`, 64 KiB stripes; metadata mirrored, `-m raid1`), mounts it at HOME/striped and caps each
member's reads in the cgroup of the rig of HOME (`nightshift rig up`) at the rig's own per-drive rate, so whatever
runs under `nightshift rig run` reads the volume at `count` x the rig's rate, as the rig's drives together. The
kernel here has no md (RAID0 through mdadm), and btrfs RAID0 is what it offers. Each thing made is recorded in
HOME/striped.json before the next is made; `down` (and a failed `up`) removes exactly those. Root only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from nightshift.engine.rig.drives import RigState

STATE = "striped.json"


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def save(home: Path, state: dict) -> None:
    (home / STATE).write_text(json.dumps(state, indent=2) + "\n")


def up(home: Path, count: int, size_mib: int) -> dict:
    rig = RigState.load(home / "nightshift-rig")
    if (home / STATE).exists():
        raise SystemExit(f"{home / STATE} exists: a striped volume is up (`down` first)")
    state: dict = {"images": [], "loops": [], "mount": None, "bdi": None}
    save(home, state)
    try:
        images = home / "striped-images"
        images.mkdir(exist_ok=True)
        for n in range(count):
            image = images / f"member{n}.img"
            with open(image, "wb") as f:
                f.truncate(size_mib << 20)
            state["images"].append(str(image))
            save(home, state)
            state["loops"].append(run("losetup", "--find", "--show", "--direct-io=on", str(image)).strip())
            save(home, state)
        run("mkfs.btrfs", "-q", "-f", "-d", "raid0", "-m", "raid1", *state["loops"])
        mount = home / "striped"
        mount.mkdir(exist_ok=True)
        run("mount", "-o", "noatime", state["loops"][0], str(mount))
        state["mount"] = str(mount)
        uuid = run("findmnt", "-n", "-o", "UUID", str(mount)).strip()
        state["bdi"] = str(Path(f"/sys/fs/btrfs/{uuid}/bdi").resolve() / "read_ahead_kb")
        save(home, state)
        throttle = rig.throttle()
        for loop in state["loops"]:
            rdev = os.stat(loop).st_rdev
            throttle.limit_reads(os.major(rdev), os.minor(rdev), rig.spec.read_bps, rig.spec.read_iops)
        return state
    except BaseException:
        down(home)
        raise


def down(home: Path) -> None:
    """Unmount, detach and delete what `up` recorded (the members' throttle lines go with their devices)."""
    if not (home / STATE).exists():
        return
    state = json.loads((home / STATE).read_text())
    problems = []
    steps = ([["umount", state["mount"]]] if state["mount"] else []) + [["losetup", "-d", x] for x in state["loops"]]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode and "not mounted" not in done.stderr:
            problems.append(f"{' '.join(argv)}: {done.stderr.strip()}")
    for image in state["images"]:
        Path(image).unlink(missing_ok=True)
    if problems:
        raise SystemExit("left behind: " + "; ".join(problems) + f" (fix, then `down` again; {home / STATE} kept)")
    (home / STATE).unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--home", type=Path, required=True, help="the data dir whose rig throttles the members")
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--size-mib", type=int, default=1024)
    args = parser.parse_args()
    if args.action == "up":
        state = up(args.home, args.count, args.size_mib)
        print(f"btrfs RAID0 over {', '.join(state['loops'])} at {state['mount']}; read-ahead: {state['bdi']}")
    else:
        down(args.home)


if __name__ == "__main__":
    main()
