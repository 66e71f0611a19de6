"""`nightshift rig ...`: build, inspect, use and remove the throttled multi-drive test rig (root only)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from nightshift.app.commands import say
from nightshift.app.commands.drives import MiB
from nightshift.app.paths import drives_file, rig_dir
from nightshift.engine.errors import NightshiftError


def cmd_up(args: argparse.Namespace) -> int:
    from nightshift.engine.rig.drives import RigSpec, check_can_build, rig_up

    if args.drives < 1 or args.size_mib < 16 or args.mbps <= 0 or (args.iops is not None and args.iops < 1):
        raise NightshiftError("need --drives >= 1, --size-mib >= 16, --mbps > 0 and, if given, --iops >= 1")
    check_can_build()  # root, loop devices, tools, a throttle: refused before it says what it is building
    spec = RigSpec(args.drives, args.size_mib * MiB, int(args.mbps * 1e6), args.iops)
    say(f"building {spec.count} drive(s) of {args.size_mib} MiB (sparse) at {args.mbps:g} MB/s in {rig_dir()}")
    state = rig_up(rig_dir(), spec, args.drives_file)
    for drive in state.drives:
        print(f"{drive.name}\t{drive.loop}\t{drive.mount}")
    say(f"drives written to {state.drives_file}; run commands in the rig with `nightshift rig run -- CMD`")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from nightshift.engine.rig.drives import rig_down

    state = rig_down(rig_dir())
    say(f"removed {len(state.drives)} drive(s), their mounts, loop devices, images and the cgroup")
    return 0


def cmd_limit(args: argparse.Namespace) -> int:
    from nightshift.engine.rig.drives import rig_limit

    state = rig_limit(rig_dir(), int(args.mbps * 1e6), args.iops)
    say(
        f"{len(state.drives)} drive(s) now limited to {args.mbps:g} MB/s"
        + (f", {args.iops} reads/s" if args.iops else "")
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from nightshift.engine.rig.drives import rig_status

    state, drives = rig_status(rig_dir())
    print("drive\tloop\tmounted\tdirect_io\tlimit MB/s\tmount")
    for d in drives:
        limit = f"{d.limit_bps / 1e6:g}" if d.limit_bps else "none"
        print(
            f"{d.name}\t{d.loop}\t{'yes' if d.mounted else 'NO'}\t{'on' if d.direct_io else 'OFF'}\t{limit}\t{d.mount}"
        )
    healthy = state.complete and all(d.mounted and d.direct_io and d.limit_bps for d in drives)
    say(
        f"cgroup {state.cgroup}; drives file {state.drives_file}; "
        + ("healthy" if healthy else "NOT healthy: run `nightshift rig down`, then `nightshift rig up`")
    )
    return 0 if healthy else 1


def cmd_run(args: argparse.Namespace) -> int:
    from nightshift.engine.rig.drives import RigState, rig_command

    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    command = rig_command(RigState.load(rig_dir()), argv)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        raise NightshiftError(f"cannot run {argv[0]}: {exc.strerror}") from exc


def cmd_verify(args: argparse.Namespace) -> int:
    from nightshift.engine.rig.drives import RigState, inside_rig
    from nightshift.engine.rig.fio import compare_with_fio

    state = RigState.load(rig_dir())
    limit = state.spec.read_bps
    settings = [(1 * MiB, 4), (17 * MiB, 1)]
    with inside_rig(state):
        results = [a for drive in state.as_drives() for a in compare_with_fio(drive, settings, args.seconds)]
    print("drive\tread\tqd\tlimit MB/s\tprobe MB/s\tfio MB/s\tprobe/fio\tfio/limit")
    for a in results:
        print(
            f"{a.drive}\t{a.read_bytes // MiB} MiB\t{a.queue_depth}\t{limit / 1e6:g}\t"
            f"{a.probe_bytes_per_s / 1e6:.1f}\t{a.fio_bytes_per_s / 1e6:.1f}\t"
            f"{a.probe_bytes_per_s / a.fio_bytes_per_s:.3f}\t{a.fio_bytes_per_s / limit:.3f}"
        )
    worst = max(max(abs(a.fio_bytes_per_s / limit - 1), abs(a.probe_bytes_per_s / limit - 1)) for a in results)
    say(f"largest deviation from the configured limit: {worst:.1%} ({'within' if worst <= 0.10 else 'OUTSIDE'} 10 %)")
    return 0 if worst <= 0.10 else 1


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Loop devices on sparse files (direct I/O), ext4, mounted under the data dir, each read-"
        "throttled by one cgroup (v1 blkio or v2 io.max). Needs root."
    )
    actions = parser.add_subparsers(dest="rig_command", metavar="ACTION", required=True)
    up = actions.add_parser(
        "up",
        help="build the rig and write its drives.toml",
        description="Build the rig; if any step fails, everything made so far is removed.",
    )
    up.add_argument("--drives", type=int, default=4, help="number of drives (default: %(default)s)")
    up.add_argument("--size-mib", type=int, default=4096, help="size of each drive, sparse (default: %(default)s)")
    up.add_argument("--mbps", type=float, default=200, help="read limit per drive in MB/s (default: %(default)s)")
    up.add_argument("--iops", type=int, help="read operations per second limit per drive (default: none)")
    up.add_argument(
        "--drives-file",
        type=Path,
        default=drives_file(),
        help="where to write the rig's drives (default: drives.toml in the data dir)",
    )
    up.set_defaults(run=cmd_up)
    actions.add_parser(
        "down",
        help="remove every mount, loop device, image and cgroup the rig made",
        description="Take the rig down (refuses while processes still run in it).",
    ).set_defaults(run=cmd_down)
    limit = actions.add_parser(
        "limit",
        help="change every rig drive's read limit",
        description="Set a new read limit on the rig's drives, keeping their data.",
    )
    limit.add_argument("--mbps", type=float, required=True, help="read limit per drive in MB/s")
    limit.add_argument("--iops", type=int, help="read operations per second limit per drive (default: none)")
    limit.set_defaults(run=cmd_limit)
    actions.add_parser(
        "status",
        help="what the kernel says about each rig drive now",
        description="Mounts, direct I/O and read limits of the rig's drives.",
    ).set_defaults(run=cmd_status)
    run = actions.add_parser(
        "run",
        help="run a command inside the rig's cgroup",
        description="Run CMD with its reads throttled per rig drive: nightshift rig run -- CMD ...",
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD")
    run.set_defaults(run=cmd_run)
    verify = actions.add_parser(
        "verify",
        help="check each rig drive against its limit with the probe and fio",
        description="Read each rig drive with the probe and with fio (1 MiB at queue depth 4, 17 MiB at 1) inside "
        "the rig's cgroup; print both next to the configured limit. Exit 1 if any is more than 10 %% off.",
    )
    verify.add_argument("--seconds", type=float, default=3.0, help="time per measurement (default: %(default)s)")
    verify.set_defaults(run=cmd_verify)
