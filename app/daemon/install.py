"""`nightshift serve --install`: a systemd user unit (Linux) or a launchd agent (macOS) that keeps the service up."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from xml.sax.saxutils import escape

from nightshift.app.paths import data_dir

LABEL = "org.nightshift.serve"


def serve_command() -> list[str]:
    """How to start the service: this interpreter running our CLI, so the unit uses this install."""
    return [sys.executable, "-m", "nightshift.app.cli", "serve"]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".part")
    temporary.write_text(text)
    os.replace(temporary, path)
    return path


def systemd_unit() -> str:
    command = " ".join(f'"{part}"' if " " in part else part for part in serve_command())
    return f"""[Unit]
Description=nightshift scheduled reviews
After=default.target

[Service]
Type=simple
Environment=NIGHTSHIFT_HOME={data_dir()}
ExecStart={command}
Restart=on-failure
RestartSec=10
Nice=10

[Install]
WantedBy=default.target
"""


def launchd_plist() -> str:
    arguments = "\n".join(f"    <string>{escape(part)}</string>" for part in serve_command())
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key><string>{LABEL}</string>
  <key>ProgramArguments</key>
  <array>
{arguments}
  </array>
  <key>EnvironmentVariables</key>
  <dict><key>NIGHTSHIFT_HOME</key><string>{escape(str(data_dir()))}</string></dict>
  <key>RunAtLoad</key><true/>
  <key>KeepAlive</key><dict><key>SuccessfulExit</key><false/></dict>
  <key>ProcessType</key><string>Background</string>
</dict>
</plist>
"""


def install(platform: str = sys.platform) -> tuple[Path, str]:
    """Write the unit for this platform; returns its path and how to enable it."""
    if platform == "darwin":
        path = _write(Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist", launchd_plist())
        return (
            path,
            f"launchctl bootstrap gui/{os.getuid()} {path}   (stop: launchctl bootout gui/{os.getuid()} {path})",
        )
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = _write(config / "systemd" / "user" / "nightshift.service", systemd_unit())
    hint = "systemctl --user daemon-reload && systemctl --user enable --now nightshift.service"
    if shutil.which("loginctl"):
        hint += (
            f"\n  to keep it running while you are logged out: loginctl enable-linger {os.environ.get('USER', '$USER')}"
        )
    return path, hint
