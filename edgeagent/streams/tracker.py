"""Tracks: the same object across frames, so a camera yields one start / updates / end per
object instead of an event per frame.

ByteTrack's association in its smallest form: each frame's detections of a label are matched
to that label's live tracks by IoU, greedily from the best pair down — confident detections
first, then the weaker ones (score ≥ half the threshold) only to tracks still unmatched, so an
object whose score dips for a frame keeps its track instead of ending and starting again.
A track starts (is *confirmed*) after ``min_hits`` frames and ends after ``max_missed`` frames
unseen. Polygons (zones and masks) are in 0..1 of the frame, so a camera that changes
resolution keeps its zones.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

Box = tuple[float, float, float, float]  # x_min, y_min, x_max, y_max in pixels


def iou(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def inside(point: tuple[float, float], polygon: Sequence[Sequence[float]]) -> bool:
    """Even-odd ray casting: whether ``point`` lies in ``polygon`` (same coordinates)."""
    x, y = point
    result = False
    for (x1, y1), (x2, y2) in zip(polygon, [*polygon[1:], polygon[0]], strict=True):
        if (y1 > y) != (y2 > y) and x < (x2 - x1) * (y - y1) / (y2 - y1) + x1:
            result = not result
    return result


def anchor(box: Box, size: tuple[int, int]) -> tuple[float, float]:
    """The bottom centre of ``box`` in 0..1 of a frame of ``size``: where an object stands.

    Kept just inside the frame, so an object cut by the frame's bottom edge (the commonest
    case: a person walking up to the camera) is still inside a zone drawn to that edge.
    """
    inner = 1 - 1e-6
    x = (box[0] + box[2]) / 2 / size[0]
    return (min(max(x, 0.0), inner), min(max(box[3] / size[1], 0.0), inner))


@dataclass(frozen=True)
class Detection:
    label: str
    score: float
    box: Box


@dataclass
class Track:
    id: int
    label: str
    score: float
    box: Box
    best_score: float
    hits: int = 1
    missed: int = 0
    confirmed: bool = False
    zones: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)  # e.g. the secondary model's answer


@dataclass
class Changes:
    """What one frame did to the tracks: the event kinds to emit."""

    started: list[Track] = field(default_factory=list)
    seen: list[Track] = field(default_factory=list)  # confirmed and matched this frame
    ended: list[Track] = field(default_factory=list)


class Tracker:
    """Live tracks of one stream (used from one task: no locking)."""

    def __init__(self, iou_threshold: float, min_hits: int, max_missed: int) -> None:
        self.iou_threshold = iou_threshold
        self.min_hits = min_hits
        self.max_missed = max_missed
        self.tracks: list[Track] = []
        self._ids = itertools.count(1)

    def update(self, detections: Sequence[Detection], high: float) -> Changes:
        """Match one frame's ``detections`` (``high`` = the confident score)."""
        changes = Changes()
        unmatched = list(self.tracks)
        strong = [d for d in detections if d.score >= high]
        weak = [d for d in detections if high / 2 <= d.score < high]
        leftover = self._match(strong, unmatched, changes)
        self._match(weak, unmatched, changes)
        for track in unmatched:
            track.missed += 1
            if track.missed > self.max_missed:
                self.tracks.remove(track)
                if track.confirmed:
                    changes.ended.append(track)
        for detection in leftover:  # only confident detections open a track
            track = Track(
                next(self._ids), detection.label, detection.score, detection.box, detection.score
            )
            self.tracks.append(track)
            self._confirm(track, changes)
        return changes

    def end_all(self) -> list[Track]:
        """Every confirmed track, ended (the stream stops or is reconfigured)."""
        ended = [t for t in self.tracks if t.confirmed]
        self.tracks.clear()
        return ended

    def _match(
        self, detections: list[Detection], unmatched: list[Track], changes: Changes
    ) -> list[Detection]:
        pairs = sorted(
            (
                (iou(t.box, d.box), ti, di)
                for ti, t in enumerate(unmatched)
                for di, d in enumerate(detections)
                if t.label == d.label
            ),
            reverse=True,
        )
        used_t: set[int] = set()
        used_d: set[int] = set()
        for overlap, ti, di in pairs:
            if overlap < self.iou_threshold:
                break
            if ti in used_t or di in used_d:
                continue
            used_t.add(ti)
            used_d.add(di)
            track, detection = unmatched[ti], detections[di]
            track.box, track.score, track.missed = detection.box, detection.score, 0
            track.hits += 1
            track.best_score = max(track.best_score, detection.score)
            if track.confirmed:
                changes.seen.append(track)
            self._confirm(track, changes)
        for ti in sorted(used_t, reverse=True):
            del unmatched[ti]
        return [d for di, d in enumerate(detections) if di not in used_d]

    def _confirm(self, track: Track, changes: Changes) -> None:
        if not track.confirmed and track.hits >= self.min_hits:
            track.confirmed = True
            changes.started.append(track)
