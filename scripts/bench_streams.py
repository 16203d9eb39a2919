#!/usr/bin/env python3
"""Camera benchmark: N RTSP streams of 720p H.264 through the agent's detector and tracker,
with events over a real Mosquitto.

Set-up: ffmpeg makes an H.264 file (``--size``, 1280×720 by default; 5 fps) from the real photos in
third-party-models/photos; GStreamer's RTSP server (devtools/rtsp_server.py, the system
python3) serves it; one ``edgeagent run`` (zoo/coco_ssd) reads ``--streams`` cameras from it,
each its own RTSP session; a paho subscriber records every event with its arrival time.

Figures:
- **event latency**: an event's arrival at the subscriber minus its frame's capture time
  (``captured_at``: when the agent decoded the frame), p50 / p95 / max;
- **max frame age**: the oldest frame any pipeline processed (``max_processed_age_s``), and
  the stale frames it refused;
- **CPU per frame**: the agent's CPU seconds (user + system, /proc) over the frames taken,
  i.e. decode + detect + tracking per frame;
- **RTSP restart**: the server is killed and started again; seconds from its "ready" until
  every stream is streaming again (the agent's log);
- **broker restart**: the broker is stopped for ``--outage`` seconds while events spool; after
  it returns and the cameras are removed (SIGHUP), events lost and duplicated (both should be 0);
- ``--soak``: RSS and open file descriptors of the agent sampled after a warm-up and at the
  end of ``--seconds`` (a 30-minute soak: ``--soak --seconds 1800``).

    python scripts/bench_streams.py                       # 4 streams, 30 s
    python scripts/bench_streams.py --soak --seconds 1800 --json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.agent_process import spawn_agent
from devtools.broker import Broker
from devtools.camera_video import loop_video, make_video
from devtools.cameras import RtspCamera, Subscriber
from edgeagent.api.client import AgentClient

REPO = Path(__file__).resolve().parents[1]
PHOTOS = ["astronaut.png", "rocket.jpg", "grace_hopper.jpg", "chelsea.png", "coffee.png",
          "motorcycle_left.png", "camera.png", "motorcycle_right.png"]  # fmt: skip


class LoggedAgent:
    """``edgeagent run`` with its log drained by a thread (a long run must never block on a
    full pipe) and searchable for lines after a point."""

    def __init__(self, workdir: Path, config: Path) -> None:
        self.socket = workdir / "agent.sock"
        self.process = spawn_agent(
            ["--config", str(config), "--socket", str(self.socket), "--port", "0"],
            state=workdir / "state", stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=workdir,
        )  # fmt: skip
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        assert first.startswith("edgeagent serving"), first
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._drain, daemon=True).start()
        self.client = AgentClient(socket_path=self.socket)

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append((time.time(), line))
                self._changed.notify_all()

    def wait_count(self, fragment: str, count: int, since: float, timeout: float = 60) -> float:
        """Wait until ``count`` lines with ``fragment`` were logged after ``since``; the time
        of the last of them."""

        def found() -> list[float]:
            return [t for t, line in self.lines if t >= since and fragment in line]

        with self._changed:
            if not self._changed.wait_for(lambda: len(found()) >= count, timeout):
                raise RuntimeError(f"{fragment!r} ×{count} not logged in {timeout:g} s")
            return found()[count - 1]

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def config_text(broker: Broker, camera: RtspCamera, streams: int, fps: float, plan: str) -> str:
    text = (
        f'[server]\nplan = "{plan}"\n'
        f'[agent]\nmodels_dir = "{REPO / "zoo"}"\nmodels = ["coco_ssd"]\ndevice_id = "bench"\n'
        f"[mqtt]\nport = {broker.port}\nreconnect_min_s = 0.2\nreconnect_max_s = 1.0\n"
    )
    for index in range(streams):
        text += (
            f'[[stream]]\nname = "cam{index}"\nurl = "{camera.url}"\nfps = {fps}\n'
            "reconnect_min_s = 0.2\nreconnect_max_s = 1\nread_timeout_s = 2\n"
        )
    return text


def streams_status(agent: LoggedAgent) -> dict:
    return agent.client.status()["streams"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--fps", type=float, default=5.0)
    parser.add_argument("--size", default="1280x720", help="the cameras' frame, WxH")
    parser.add_argument("--photo-seconds", type=float, default=3.0, help="each photo held")
    parser.add_argument(
        "--plan", choices=("auto", "fixed"), default="auto", help="[server] plan of the agent"
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--outage", type=float, default=5.0, help="broker down for this long")
    parser.add_argument("--soak", action="store_true", help="report RSS and fd growth")
    parser.add_argument("--sample-s", type=float, default=60.0, help="soak: RSS/fds every")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict = {
        "streams": args.streams,
        "fps": args.fps,
        "size": args.size,
        "seconds": args.seconds,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # A file long enough that a session rarely ends inside the window (each client's
        # session ends at the end of the file and the agent reconnects, as after a reboot).
        cycles = max(1, int(args.seconds // (args.photo_seconds * len(PHOTOS))) + 1)
        width, height = (int(v) for v in args.size.split("x"))
        cycle = make_video(
            work / "cycle.mp4", PHOTOS, width=width, height=height, seconds=args.photo_seconds
        )
        video = loop_video(work / "cam.mp4", cycle, cycles)
        broker = Broker(work / "broker")
        broker.start()
        camera = RtspCamera(video).start()
        subscriber = Subscriber(broker.port, "edgeagent/#", client_id="bench")
        arrivals: dict[str, float] = {}
        original = subscriber._on_message

        def on_message(client, userdata, message) -> None:  # type: ignore[no-untyped-def]
            if message.topic.endswith("/events"):
                arrivals.setdefault(json.loads(message.payload)["id"], time.time())
            original(client, userdata, message)

        subscriber.client.on_message = on_message
        config = work / "agent.toml"
        config.write_text(config_text(broker, camera, args.streams, args.fps, args.plan))
        agent = LoggedAgent(work, config)
        try:
            agent.wait_count("connecting -> streaming", args.streams, 0)
            time.sleep(min(10.0, args.seconds / 3))  # warm-up: the plan search, first tracks
            rss0, fds0 = agent.rss_mb(), agent.fds()
            before = streams_status(agent)["streams"]
            cpu0, t0 = agent.cpu_s(), time.time()
            samples = []  # (seconds into the window, RSS MB, fds): the soak's curve
            while time.time() < t0 + args.seconds:  # the cameras run on their own meanwhile
                time.sleep(max(0.0, min(args.sample_s, t0 + args.seconds - time.time())))
                samples.append((round(time.time() - t0), round(agent.rss_mb(), 1), agent.fds()))
            cpu1, t1 = agent.cpu_s(), time.time()
            after = streams_status(agent)["streams"]
            taken = sum(after[n]["frames_taken"] - before[n]["frames_taken"] for n in after)
            processed = sum(
                after[n]["frames_processed"] - before[n]["frames_processed"] for n in after
            )
            events = [e for e in subscriber.events() if t0 <= arrivals.get(e["id"], 0) <= t1]
            latency = sorted(arrivals[e["id"]] - e["captured_at"] for e in events)
            results["window"] = {
                "frames_taken": taken,
                "frames_processed": processed,
                "frames_stale": sum(after[n]["frames_stale"] for n in after),
                "frames_dropped": sum(after[n]["frames_dropped"] for n in after),
                "max_frame_age_s": max(after[n]["max_processed_age_s"] for n in after),
                "cpu_ms_per_frame": round(1000 * (cpu1 - cpu0) / max(taken, 1), 1),
                "cpu_cores_used": round((cpu1 - cpu0) / (t1 - t0), 2),
                "events": len(events),
                "event_latency_s": {
                    "p50": round(statistics.median(latency), 3) if latency else None,
                    "p95": round(latency[int(0.95 * (len(latency) - 1))], 3) if latency else None,
                    "max": round(latency[-1], 3) if latency else None,
                },
            }
            if args.soak:
                results["soak"] = {
                    "rss_mb_start": round(rss0, 1),
                    "rss_mb_end": round(agent.rss_mb(), 1),
                    "rss_growth_mb": round(agent.rss_mb() - rss0, 1),
                    "fds_start": fds0,
                    "fds_end": agent.fds(),
                    # From the first sample on: what is left once the allocator and the
                    # caches have warmed (the first minute) is what a leak would look like.
                    "rss_growth_after_first_sample_mb": round(samples[-1][1] - samples[0][1], 1),
                    "samples": samples,
                }
            # RTSP server restart: every stream back.
            camera.kill()
            agent.wait_count("streaming -> ", args.streams, t1)
            camera.start()
            ready = time.time()
            back = agent.wait_count("connecting -> streaming", args.streams, ready)
            results["rtsp_restart_recovery_s"] = round(back - ready, 2)
            # Broker restart: events spool, then each is delivered once.
            broker.stop()
            time.sleep(args.outage)  # the outage itself: the cameras keep making events
            broker.start()
            config.write_text(config_text(broker, camera, 0, args.fps, args.plan))
            agent.process.send_signal(signal.SIGHUP)
            agent.wait_count("reloaded: serving", 1, ready)
            deadline = time.time() + 60
            while streams_status(agent)["events"]["pending"] and time.time() < deadline:
                time.sleep(0.2)
            outbox = streams_status(agent)["events"]
            subscriber.wait("every event", lambda: len(arrivals) >= outbox["spooled"], 60)
            ids = Counter(e["id"] for e in subscriber.events())
            results["broker_restart"] = {
                "events_spooled": outbox["spooled"],
                "events_received": len(ids),
                "lost": outbox["spooled"] - len(ids),
                "duplicated": sum(n - 1 for n in ids.values()),
                "spool_dropped": outbox["dropped"],
            }
        finally:
            agent.stop()
            subscriber.close()
            camera.kill()
            broker.stop()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
