"""H.264 test videos made from the real photos in third-party-models/photos, with ffmpeg.

Each photo is scaled into a ``width``×``height`` frame (letterboxed) and held for ``seconds``;
the result plays like a camera watching a changing scene, so a detector finds real objects
(the astronaut and Grace Hopper are people, the cat is a cat) and tracks start and end. A
short keyframe interval lets a client that joins (or rejoins) mid-stream decode at once.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

PHOTOS = Path(__file__).resolve().parents[1] / "third-party-models" / "photos"


def make_video(
    out: Path,
    photos: Sequence[str],
    *,
    width: int = 640,
    height: int = 360,
    fps: int = 5,
    seconds: float = 2.0,
    gop: int = 5,
    extra: Sequence[str] = (),
) -> Path:
    """Write ``out`` (.mp4, .mkv or raw .h264) from ``photos`` (names in PHOTOS)."""
    inputs: list[str] = []
    chains: list[str] = []
    for index, name in enumerate(photos):
        inputs += ["-loop", "1", "-t", f"{seconds:g}", "-r", str(fps), "-i", str(PHOTOS / name)]
        chains.append(
            f"[{index}:v]scale={width}:{height}:force_original_aspect_ratio=decrease,"
            f"pad={width}:{height}:(ow-iw)/2:(oh-ih)/2,setsar=1,format=yuv420p[v{index}]"
        )
    graph = ";".join(chains) + ";" + "".join(f"[v{i}]" for i in range(len(photos)))
    graph += f"concat=n={len(photos)}:v=1:a=0[out]"
    command = [
        "ffmpeg", "-hide_banner", "-loglevel", "error", "-y", *inputs,
        "-filter_complex", graph, "-map", "[out]", "-r", str(fps),
        "-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency",
        "-g", str(gop), "-bf", "0", *extra, str(out),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return out


def join_videos(out: Path, parts: Sequence[Path]) -> Path:
    """``parts`` one after the other in ``out`` (MPEG-TS keeps each part's own SPS in-band, so
    the joined stream changes resolution where a part of another size begins)."""
    listing = out.with_suffix(".txt")
    listing.write_text("".join(f"file '{part.resolve()}'\n" for part in parts))
    command = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "concat",
               "-safe", "0", "-i", str(listing), "-c", "copy", str(out)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    return out


def loop_video(out: Path, cycle: Path, times: int) -> Path:
    """``cycle`` played ``times`` times in ``out``, without encoding it again (a soak's hour of
    video in seconds: one ffmpeg input per photo would not scale to it)."""
    repeats = str(max(0, times - 1))
    command = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y",
               "-stream_loop", repeats, "-i", str(cycle), "-c", "copy", str(out)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return out
