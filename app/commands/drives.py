"""`nightshift drives ...`: the drives in drives.toml, the devices under them, their read ceilings."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from nightshift.app.commands import say
from nightshift.app.paths import drives_file, rig_dir
from nightshift.engine.errors import NightshiftError

MiB = 1 << 20


def cmd_show(args: argparse.Namespace) -> int:
    from nightshift.engine.io.devices import resolve_device
    from nightshift.engine.io.drives import load_drives

    devices = [(drive, resolve_device(drive.root)) for drive in load_drives(args.drives_file)]
    print("drive\troot\tmount\tfs\tdevice\tdisk")
    for drive, d in devices:
        print(f"{drive.name}\t{drive.root}\t{d.mount_point}\t{d.fs_type}\t{d.device}\t{d.disk}")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from nightshift.engine.io.ceilings import CEILINGS_FILE, Ceilings
    from nightshift.engine.io.drives import load_drives
    from nightshift.engine.io.probe import probe_drive

    if args.seconds <= 0 or args.file_mib < 1:
        raise NightshiftError("--seconds and --file-mib must be positive")
    sizes, depths = _sizes(args.sizes), _ints(args.depths, "--depths")
    drives = load_drives(args.drives_file)
    with _inside_rig_if_these_are_its_drives(args.drives_file) as where:
        say(f"probing {len(drives)} drive(s): {len(sizes) * len(depths)} cells of {args.seconds:g} s each; {where}")
        measured = []
        for drive in drives:
            say(f"{drive.name}: writing a {args.file_mib} MiB probe file, then reading it")
            measured.append(probe_drive(drive, sizes, depths, args.seconds, args.file_mib * MiB))
    ceilings = Ceilings(datetime.now(UTC).isoformat(timespec="seconds"), where, measured)
    print(format_table(ceilings, sizes, depths))
    target = Path(args.drives_file).parent / CEILINGS_FILE
    ceilings.save(target)
    say(f"saved to {target}")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from nightshift.engine.instruments.monitor import DriveMonitor
    from nightshift.engine.io.devices import resolve_device
    from nightshift.engine.io.drives import load_drives

    if args.every <= 0 or args.seconds <= 0:
        raise NightshiftError("--every and --seconds must be positive")
    drives = load_drives(args.drives_file)
    devices = [resolve_device(d.root).counters_name for d in drives]
    print("time_s\tdrive\tread MB/s\treads/s\tin flight")
    with DriveMonitor([d.name for d in drives], devices) as monitor:
        start = time.monotonic()
        for _ in range(max(1, round(args.seconds / args.every))):
            time.sleep(args.every)
            for name, r in monitor.rates(args.every).items():
                print(
                    f"{time.monotonic() - start:.1f}\t{name}\t{r.os_bytes_per_s / 1e6:.1f}\t"
                    f"{r.os_reads_per_s:.0f}\t{r.os_in_flight:.2f}",
                    flush=True,
                )
    c = monitor.cadence()
    say(
        f"{c.samples} samples, gap p50 {c.p50_gap_s * 1e3:.2f} ms, p99 {c.p99_gap_s * 1e3:.2f} ms, "
        f"{c.skipped_slots} slots skipped, sampler CPU {c.cpu_fraction:.1%} of one core"
    )
    return 0


def format_table(ceilings, sizes: list[int], depths: list[int]) -> str:
    """MB/s per drive and read size (rows) by queue depth (columns), then each drive's best."""
    lines = ["drive\tread\t" + "\t".join(f"qd{d} MB/s" for d in depths) + "\tmode"]
    for drive in ceilings.drives:
        for size in sizes:
            cells = [drive.cell(size, d) for d in depths]
            rates = "\t".join(f"{c.bytes_per_s / 1e6:.0f}" if c else "-" for c in cells)
            lines.append(f"{drive.name}\t{_size_label(size)}\t{rates}\t{drive.mode}")
    return "\n".join(lines)


@contextmanager
def _inside_rig_if_these_are_its_drives(path: Path) -> Iterator[str]:
    """The rig's drives are only throttled inside its cgroup, so probe them from there; yields where."""
    from nightshift.engine.rig.drives import RigError, RigState, inside_rig

    try:
        state = RigState.load(rig_dir())
    except RigError:
        yield "outside any rig"
        return
    if state.drives_file and Path(state.drives_file).resolve() == Path(path).resolve():
        with inside_rig(state):
            yield f"inside the rig's cgroup ({state.spec.read_bps / 1e6:g} MB/s per drive)"
    else:
        yield "outside the rig (these are not its drives)"


def _size_label(size: int) -> str:
    return f"{size // MiB} MiB" if size % MiB == 0 else f"{size >> 10} KiB"


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise NightshiftError(f"{option} takes comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise NightshiftError(f"{option} values must be at least 1, got {text!r}")
    return values


def _sizes(text: str) -> list[int]:
    """Read sizes like "256K,1M,17M" in bytes; each a multiple of 4 KiB (direct I/O needs it)."""
    units = {"K": 1 << 10, "M": MiB}
    sizes = []
    for item in text.upper().split(","):
        unit = units.get(item[-1:])
        try:
            size = int(item[:-1]) * unit if unit else int(item)
        except ValueError:
            raise NightshiftError(f"--sizes: {item!r} is not a size like 256K or 17M") from None
        if size < 4096 or size % 4096:
            raise NightshiftError(f"--sizes: {item!r} must be a positive multiple of 4K for direct reads")
        sizes.append(size)
    return sizes


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "The drives listed in drives.toml: the devices under them and their direct-I/O read ceilings."
    actions = parser.add_subparsers(dest="drives_command", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show",
        help="each drive's mount, file system, device and disk",
        description="Resolve each drive root to its mount, device and whole disk.",
    )
    show.set_defaults(run=cmd_show)
    probe = actions.add_parser(
        "probe",
        help="measure each drive's direct-I/O read ceiling",
        description="Write a probe file on each drive, read it with direct I/O at every read size and queue "
        "depth, print MB/s as a table and save it (drive_ceilings.json next to drives.toml) for the "
        "streaming dispatcher. If these are the rig's drives, reads run inside the rig's cgroup.",
    )
    probe.add_argument("--sizes", default="256K,1M,4M,17M", help="read sizes (default: %(default)s)")
    probe.add_argument("--depths", default="1,4,16", help="queue depths (default: %(default)s)")
    probe.add_argument("--seconds", type=float, default=1.0, help="time per cell (default: %(default)s)")
    probe.add_argument("--file-mib", type=int, default=256, help="probe file size (default: %(default)s)")
    probe.set_defaults(run=cmd_probe)
    watch = actions.add_parser(
        "watch",
        help="live read rates of each drive from the OS device counters",
        description="Sample each drive's device counters every 10 ms and print MB/s, reads/s and reads in "
        "flight per drive every --every seconds, whoever is reading.",
    )
    watch.add_argument("--every", type=float, default=1.0, help="print interval in seconds (default: %(default)s)")
    watch.add_argument("--seconds", type=float, default=10.0, help="how long to watch (default: %(default)s)")
    watch.set_defaults(run=cmd_watch)
    for action in (show, probe, watch):
        action.add_argument(
            "--drives-file", type=Path, default=drives_file(), help="drives file (default: drives.toml in the data dir)"
        )
