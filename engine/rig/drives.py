"""A multi-drive rig on one disk: loop devices on sparse files, ext4, mounted, each read-throttled.

Every drive is a real block device (loop with direct I/O, so reads reach the disk rather
than the host page cache) with real device counters; one cgroup caps each device's read
rate, and whatever runs inside it (`rig_command`, `inside_rig`) sees drives of that speed.

The rig records each thing it makes in `rig.json` before moving on, so `rig_down` can
remove exactly that, and a failed `rig_up` removes what it had made before re-raising.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nightshift.engine.errors import NightshiftError
from nightshift.engine.io.ceilings import CEILINGS_FILE, Ceilings, CeilingsFileError
from nightshift.engine.io.devices import mount_of, parse_mountinfo
from nightshift.engine.io.drives import Drive, format_drives
from nightshift.engine.rig.cgroups import (
    CgroupError,
    ReadThrottle,
    command_in,
    create_throttle,
    current_cgroup,
    remove_throttle,
    throttle_root,
)

STATE_FILE = "rig.json"
MB = 1_000_000
DETACH_WAIT_S = 10.0  # how long a loop device detached may take to let go of its image


class RigError(NightshiftError):
    """The rig cannot be built, inspected or taken down; the message says what is left and what to do."""


@dataclass
class RigSpec:
    """What to build: `count` drives of `size_bytes`, each capped at `read_bps` (and `read_iops`)."""

    count: int = 4
    size_bytes: int = 4 << 30
    read_bps: int = 200 * MB
    read_iops: int | None = None


@dataclass
class RigDrive:
    name: str
    image: str
    mount: str
    loop: str | None = None
    major: int | None = None
    minor: int | None = None
    image_made: bool = False  # teardown removes only what the rig made
    mount_made: bool = False


@dataclass
class RigState:
    """What the rig made, as recorded in rig.json."""

    rig_dir: str
    spec: RigSpec
    cgroup: str | None = None
    drives_file: str | None = None
    drives_text: str | None = None
    drives: list[RigDrive] = field(default_factory=list)
    complete: bool = False

    def save(self) -> None:
        path = Path(self.rig_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, rig_dir: Path) -> RigState:
        path = Path(rig_dir) / STATE_FILE
        if not path.is_file():
            raise RigError(f"no rig at {rig_dir} (no {STATE_FILE}); `nightshift rig up` builds one")
        try:
            data = json.loads(path.read_text())
            data["spec"] = RigSpec(**data["spec"])
            data["drives"] = [RigDrive(**d) for d in data["drives"]]
            return cls(**data)
        except (ValueError, KeyError, TypeError) as exc:
            raise RigError(
                f"{path} is not a rig record nightshift can read ({exc}); remove what it lists "
                "by hand (umount, losetup -d, rmdir the cgroup), then delete it"
            ) from exc

    def throttle(self) -> ReadThrottle:
        if not self.cgroup:
            raise RigError(f"the rig at {self.rig_dir} has no cgroup; take it down and build it again")
        version, _ = throttle_root()
        return ReadThrottle(Path(self.cgroup), version)

    def as_drives(self) -> list[Drive]:
        return [Drive(d.name, Path(d.mount)) for d in self.drives]


def cgroup_name(rig_dir: Path) -> str:
    """The rig's cgroup: named for its directory, so rigs in two data dirs never share one."""
    return f"nightshift-rig-{hashlib.sha256(str(Path(rig_dir).resolve()).encode()).hexdigest()[:10]}"


def check_can_build() -> None:
    """Raise RigError saying what is missing (root, loop devices, tools, a read throttle)."""
    if os.geteuid() != 0:
        raise RigError("building a rig needs root (loop devices, mounts, cgroups); run it with sudo")
    if not Path("/dev/loop-control").exists():
        raise RigError("no loop devices here (/dev/loop-control missing); load the `loop` kernel module")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if not shutil.which(tool):
            raise RigError(f"`{tool}` is not installed; install util-linux and e2fsprogs")
    try:
        throttle_root()
    except CgroupError as exc:
        raise RigError(str(exc)) from exc


def rig_up(rig_dir: Path, spec: RigSpec, drives_file: Path) -> RigState:
    """Build the rig in `rig_dir` and write its drives to `drives_file`; on any failure, undo and re-raise."""
    check_can_build()
    rig_dir = Path(rig_dir).resolve()
    if (rig_dir / STATE_FILE).exists():
        raise RigError(f"a rig is already up at {rig_dir}; `nightshift rig down` first")
    if drives_file.exists():
        raise RigError(f"{drives_file} already exists; move it away or write the rig's drives elsewhere")
    rig_dir.mkdir(parents=True, exist_ok=True)
    state = RigState(str(rig_dir), spec)
    state.save()
    try:
        _build(state, Path(drives_file))
    except BaseException as exc:  # Ctrl-C half-way must not leave half a rig either
        try:
            _teardown(state)
        except RigError as cleanup:
            raise RigError(f"building the rig failed ({exc!r}); cleaning up also failed: {cleanup}") from exc
        if isinstance(exc, (NightshiftError, OSError)):
            raise RigError(f"building the rig failed: {exc}; everything it had made was removed") from exc
        raise
    return state


def _build(state: RigState, drives_file: Path) -> None:
    spec, rig_dir = state.spec, Path(state.rig_dir)
    throttle = create_throttle(cgroup_name(rig_dir))
    state.cgroup = str(throttle.path)
    state.save()
    for i in range(spec.count):
        drive = RigDrive(f"rig{i}", str(rig_dir / "images" / f"rig{i}.img"), str(rig_dir / "mnt" / f"rig{i}"))
        state.drives.append(drive)
        state.save()
        _make_image(drive, spec.size_bytes)
        state.save()
        # Inode tables and journal written now, so no lazy background writes skew reads later.
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", drive.image)
        drive.loop = _run("losetup", "--find", "--show", "--direct-io=on", drive.image).strip()
        state.save()
        loop_name = Path(drive.loop).name
        if Path(f"/sys/block/{loop_name}/loop/dio").read_text().strip() != "1":
            raise RigError(f"{drive.loop} did not take direct I/O; its reads would come from the page cache")
        rdev = os.stat(drive.loop).st_rdev
        drive.major, drive.minor = os.major(rdev), os.minor(rdev)
        state.save()
        try:
            Path(drive.mount).parent.mkdir(parents=True, exist_ok=True)
            Path(drive.mount).mkdir()
        except OSError as exc:
            raise RigError(f"cannot create mount point {drive.mount}: {exc.strerror}") from exc
        drive.mount_made = True
        state.save()
        _run("mount", "-o", "noatime", drive.loop, drive.mount)
        throttle.limit_reads(drive.major, drive.minor, spec.read_bps, spec.read_iops)
    state.drives_text = format_drives(state.as_drives())
    state.drives_file = str(drives_file)
    state.save()
    drives_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = drives_file.with_name(drives_file.name + ".tmp")
    tmp.write_text(state.drives_text)
    os.replace(tmp, drives_file)
    state.complete = True
    state.save()


def _make_image(drive: RigDrive, size: int) -> None:
    """A new sparse file of `size` bytes (never one that was there before)."""
    path = Path(drive.image)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "xb") as f:
            drive.image_made = True
            f.truncate(size)
    except FileExistsError:
        raise RigError(f"{path} already exists; remove it or build the rig elsewhere") from None


def rig_down(rig_dir: Path) -> RigState:
    """Remove everything the rig at `rig_dir` made; what cannot be removed is named in the error."""
    state = RigState.load(rig_dir)
    if state.cgroup and Path(state.cgroup).exists() and (pids := state.throttle().pids()):
        raise RigError(f"processes {pids} still run in the rig ({state.cgroup}); stop them first")
    _teardown(state)
    return state


def _teardown(state: RigState) -> None:
    """Undo whatever of `state` exists, last made first; tolerant of things already gone."""
    problems: list[str] = []
    if state.drives_file and Path(state.drives_file).is_file():
        if Path(state.drives_file).read_text() == state.drives_text:
            Path(state.drives_file).unlink()
        else:
            problems.append(f"{state.drives_file} was changed since the rig wrote it; left in place")
    _remove_rig_ceilings(state)
    if state.cgroup:
        try:
            remove_throttle(Path(state.cgroup))
        except CgroupError as exc:
            problems.append(str(exc))
    mounted = {m.mount_point for m in parse_mountinfo(Path("/proc/self/mountinfo").read_text())}
    for drive in reversed(state.drives):
        if Path(drive.mount) in mounted and not _try("umount", drive.mount, problems=problems):
            continue
        if drive.mount_made:
            _rmdir(Path(drive.mount), problems)
        if drive.image_made and Path(drive.image).exists():
            for loop in _loops_backed_by(drive.image):
                _try("losetup", "-d", loop, problems=problems)
            if still := _still_backed_by(drive.image):
                problems.append(f"{drive.image} is still attached to {', '.join(still)}")
            else:
                Path(drive.image).unlink()
    if problems:
        raise RigError("the rig was not fully removed: " + "; ".join(problems))
    rig_dir = Path(state.rig_dir)
    (rig_dir / STATE_FILE).unlink(missing_ok=True)
    for leftover in (rig_dir / "mnt", rig_dir / "images", rig_dir):
        _rmdir(leftover, [])  # a directory holding something we did not make stays


def _remove_rig_ceilings(state: RigState) -> None:
    """Ceilings probed on the rig's drives describe drives about to vanish; drop them with the drives file."""
    if not state.drives_file:
        return
    path = Path(state.drives_file).parent / CEILINGS_FILE
    try:
        roots = {d.root for d in Ceilings.load(path).drives}
    except CeilingsFileError:
        return
    if roots <= {d.mount for d in state.drives}:
        path.unlink()


def _loops_backed_by(image: str) -> list[str]:
    out = _run("losetup", "--noheadings", "--output", "NAME", "--associated", image)
    return out.split()


def _still_backed_by(image: str, within: float = DETACH_WAIT_S) -> list[str]:
    """The loop devices still backed by `image` after waiting up to `within` seconds for them to go: `losetup -d`
    can return while the kernel still holds the association for a moment (a look at once failed 3 of 4 runs of
    tests/test_rig.py on two xdist workers here, 2026-12-04)."""
    deadline = time.monotonic() + within
    while (still := _loops_backed_by(image)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return still


def _rmdir(path: Path, problems: list[str]) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        problems.append(f"cannot remove {path}: {exc.strerror}")


def _run(*argv: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True)
    except OSError as exc:
        raise RigError(f"cannot run {argv[0]}: {exc.strerror}") from exc
    if done.returncode != 0:
        raise RigError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def _try(*argv: str, problems: list[str]) -> bool:
    try:
        _run(*argv)
        return True
    except RigError as exc:
        problems.append(str(exc))
        return False


@dataclass(frozen=True)
class DriveStatus:
    name: str
    loop: str | None
    mount: str
    mounted: bool
    direct_io: bool
    limit_bps: int | None


def rig_limit(rig_dir: Path, read_bps: int, read_iops: int | None = None) -> RigState:
    """Change the read limit of every drive of a built rig (same drives, same data: a benchmark at another speed)."""
    if read_bps <= 0 or (read_iops is not None and read_iops < 1):
        raise RigError("the read limit must be above 0 bytes/s (and, if given, at least 1 read/s)")
    state = RigState.load(rig_dir)
    if not state.complete:
        raise RigError(f"the rig at {rig_dir} was not fully built; `nightshift rig down`, then `nightshift rig up`")
    throttle = state.throttle()
    for drive in state.drives:
        throttle.limit_reads(drive.major, drive.minor, read_bps, read_iops)
    state.spec.read_bps, state.spec.read_iops = read_bps, read_iops
    state.save()
    return state


def rig_status(rig_dir: Path) -> tuple[RigState, list[DriveStatus]]:
    """The recorded rig and, per drive, what the kernel says about it now."""
    state = RigState.load(rig_dir)
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    limits = state.throttle().read_limits() if state.cgroup and Path(state.cgroup).exists() else {}
    statuses = []
    for d in state.drives:
        mounted = Path(d.mount).exists() and mount_of(Path(d.mount), mounts).mount_point == Path(d.mount)
        dio = Path(f"/sys/block/{Path(d.loop).name}/loop/dio") if d.loop else None
        statuses.append(
            DriveStatus(
                d.name,
                d.loop,
                d.mount,
                mounted,
                bool(dio and dio.exists() and dio.read_text().strip() == "1"),
                limits.get((d.major, d.minor)),
            )
        )
    return state, statuses


def rig_command(state: RigState, argv: list[str]) -> list[str]:
    """`argv` wrapped so it runs inside the rig's cgroup (reads throttled per drive)."""
    if not argv:
        raise RigError("give a command to run in the rig, e.g. `nightshift rig run -- fio job.fio`")
    return command_in(state.throttle().procs_file, argv)


@contextmanager
def inside_rig(state: RigState) -> Iterator[None]:
    """This process (all its threads) inside the rig's cgroup, its reads throttled, for the block;
    then back in the cgroup it came from."""
    throttle = state.throttle()
    came_from = current_cgroup(throttle.version)
    throttle.add(os.getpid())
    try:
        yield
    finally:
        ReadThrottle(came_from, throttle.version).add(os.getpid())
