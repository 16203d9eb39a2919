"""``edgeagent profile``: what board this is, what works on it, and what each model runs on.

A diagnostic, so it probes every candidate (not only until the first works) and times the
chosen one: an operator asking "why is my model on the CPU?" gets the runtime's own answer for
each accelerator.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.config import load_config
from edgeagent.engine.language.loading import Attempt, NoCandidate, place
from edgeagent.engine.language.settings import LanguageSettings
from edgeagent.engine.plan import plan_request
from edgeagent.engine.settings import EngineSettings
from edgeagent.hardware.choose import Choice, time_session, why_not
from edgeagent.hardware.detect import Detection, detect, read_facts
from edgeagent.hardware.plan_search import PlanShape
from edgeagent.hardware.profile import ProfileError, board_profiles
from edgeagent.hardware.service import Accelerators
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.models.golden import sample_feeds
from edgeagent.models.locate import find_packages
from edgeagent.models.package import ModelPackage, PackageError, load_package
from edgeagent.paths import default_models_dir
from edgeagent.sections import ConfigError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "profile",
        formatter_class=DefaultsFormatter,
        help="show the detected board, every accelerator candidate and the choice per model",
        description=(
            "Detect the board from its files (device tree, /etc/nv_tegra_release, cpuinfo, device "
            "nodes), show which device profile matched and why, probe every candidate of that "
            "profile for every model package (a real load and one inference; the runtime's own "
            "error when it fails), and show the chosen candidate per model with its measured "
            "batch-1 latency. Exit status 1 when a model has no working candidate."
        ),
    )
    parser.add_argument(
        "--config", type=Path, metavar="PATH", help="agent config file (default: system file)"
    )
    parser.add_argument(
        "--root", type=Path, metavar="DIR", help="read board files below DIR (default: /)"
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        metavar="DIR",
        help="model packages (default: [agent] models_dir, $EDGEAGENT_MODELS_DIR, ./zoo)",
    )
    parser.add_argument(
        "--profiles-dir", type=Path, metavar="DIR", help="device profiles (default: shipped)"
    )
    parser.add_argument(
        "--profile", metavar="NAME", help="use this profile instead of detecting one"
    )
    parser.add_argument(
        "--choice", choices=("ranked", "fastest"), help="choice mode (default: [hardware] choice)"
    )
    parser.add_argument("--state-dir", type=Path, metavar="DIR", help="where the probe cache lives")
    parser.add_argument(
        "--reprobe", action="store_true", help="ignore cached probe results and decisions"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=1.0,
        metavar="S",
        help="time the chosen candidate this long",
    )
    parser.add_argument(
        "--board",
        action="store_true",
        help="only detect the board: profile and the package extras its candidates need "
        "(no probing; what scripts/install-device.sh asks)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run)


def _packages(models_dir: Path) -> list[tuple[Path, ModelPackage | str]]:
    """Every package in ``models_dir``, or why it cannot be read (one bad one stops nothing)."""
    if not models_dir.is_dir():
        return []
    found: list[tuple[Path, ModelPackage | str]] = []
    for path in find_packages(models_dir).values():
        try:
            found.append((path, load_package(path)))
        except PackageError as exc:
            found.append((path, str(exc)))
    return found


def _explain(
    acc: Accelerators, package: ModelPackage, args: argparse.Namespace, engine: EngineSettings
) -> dict:
    choice = acc.choose(package, use_cache=not args.reprobe)
    _probe_rest(acc, package, choice, use_cache=not args.reprobe)
    latency = None
    plan = None
    if choice.session is not None:
        latency = round(time_session(choice.session, sample_feeds(package), args.seconds), 3)
        # The execution plan the daemon would serve (cached, or measured now as at load).
        assert choice.chosen is not None
        planned = acc.plan_of(
            package,
            choice.chosen,
            choice.session,
            plan_request(engine, package),
            use_cache=not args.reprobe,
        )
        plan = planned.plan.to_dict()
        for session in planned.sessions:
            session.close()
    candidates = []
    for option in choice.options:
        result = choice.results.get(option.key)
        chosen = choice.chosen is not None and option.key == choice.chosen.key
        if chosen:
            state = "chosen"
        elif option.dropped or (result is not None and not result.ok):
            state = "dropped"
        else:
            state = "kept"
        candidates.append(
            {
                "candidate": option.key,
                "rank": option.rank + 1,
                "power": option.candidate.power,
                "state": state,
                "why": "" if chosen else why_not(choice, option),
                "probe": result.to_dict() if result is not None else None,
                "latency_ms": choice.latency_ms.get(option.key),
            }
        )
    return {
        "model": package.name,
        "version": package.version,
        "path": str(package.root),
        "mode": choice.mode,
        "chosen": choice.chosen.key if choice.chosen else None,
        "reason": choice.reason,
        "median_latency_ms": latency,
        "plan": plan,
        "candidates": candidates,
    }


def _explain_language(package: ModelPackage, settings: LanguageSettings) -> dict:
    """A language model's choice as the daemon makes it (``engine.language.loading.place``):
    every variant × device a generative runtime offers, proved by decoding a few tokens and
    ranked by the rate measured; the latency shown is the chosen one's time per token."""
    attempts: tuple[Attempt, ...] = ()
    chosen: str | None = None
    rate: float | None = None
    try:
        placed = place(package, settings)
    except NoCandidate as exc:
        reason = str(exc)
    else:
        placed.session.close()
        chosen = f"{placed.runtime}:{placed.device}:{placed.variant.precision}"
        rate, attempts = placed.tokens_per_s, placed.tried
        reason = f"the fastest of {len(attempts)} candidate(s) at {rate:.1f} tokens/s decoded"
    ranked = sorted(attempts, key=lambda a: -(a.tokens_per_s or -1.0))
    candidates = []
    for rank, attempt in enumerate(ranked):
        runtime, _, precision = attempt.variant.partition("/")
        key = f"{runtime}:{attempt.device or '-'}:{precision}"
        state = "chosen" if key == chosen else "kept" if attempt.tokens_per_s else "dropped"
        candidates.append(
            {
                "candidate": key,
                "rank": rank + 1,
                "power": "high",
                "state": state,
                "why": attempt.error,
                "probe": None,
                "latency_ms": round(1000 / attempt.tokens_per_s, 3)
                if attempt.tokens_per_s
                else None,
                "tokens_per_s": attempt.tokens_per_s,
            }
        )
    return {
        "model": package.name,
        "version": package.version,
        "path": str(package.root),
        "mode": "generated",
        "chosen": chosen,
        "reason": reason,
        "median_latency_ms": round(1000 / rate, 3) if rate else None,
        "plan": None,
        "candidates": candidates,
    }


def _probe_rest(
    acc: Accelerators, package: ModelPackage, choice: Choice, *, use_cache: bool
) -> None:
    """Probe the candidates the choice did not need, so each one gets a real verdict."""
    model_hash = package.content_hash()
    for option in choice.options:
        if option.dropped or option.key in choice.results or option.variant is None:
            continue
        session, result = acc.prober.load(
            package, option.candidate, option.variant, model_hash=model_hash, use_cache=use_cache
        )
        choice.results[option.key] = result
        if session is not None:
            session.close()


def wanted_extras(detection: Detection) -> list[str]:
    """The edgeagent extras (``litert``, ``openvino``) that the profile's candidates run on.

    Read from the installed distribution's ``Provides-Extra``, so a runtime without an extra
    (onnxruntime is a base dependency) is never asked for.
    """
    try:
        offered = set(metadata.metadata("edgeagent").get_all("Provides-Extra") or [])
    except metadata.PackageNotFoundError:  # a source tree without an install: nothing to offer
        offered = set()
    return sorted({c.runtime for c in detection.profile.candidates} & offered)


def _board(hardware: HardwareSettings, as_json: bool) -> int:
    detection = detect(
        board_profiles(hardware.profiles_dir), read_facts(hardware.root), hardware.profile
    )
    extras = wanted_extras(detection)
    if as_json:
        print(json.dumps({**detection.report(), "extras": extras}, indent=2))
    else:
        print(f"profile {detection.profile.name}: {detection.profile.description}")
        print(f"why     {detection.reason}")
        print(f"extras  {','.join(extras) or '-'}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        hardware = config.hardware
        overrides = {
            "root": args.root,
            "profiles_dir": args.profiles_dir,
            "profile": args.profile,
            "choice": args.choice,
        }
        hardware = replace(hardware, **{k: v for k, v in overrides.items() if v is not None})
        if args.board:
            return _board(hardware, args.json)
        state_dir = args.state_dir or config.agent.state_dir
        acc = Accelerators(hardware, state_dir)
    except (ConfigError, ProfileError) as exc:
        print(f"edgeagent profile: {exc}", file=sys.stderr)
        return 2
    models_dir = args.models_dir or config.agent.models_dir or default_models_dir()
    models: list[dict] = []
    try:
        packages = _packages(models_dir)
    except PackageError as exc:  # the directory itself cannot be read
        print(f"edgeagent profile: {exc}", file=sys.stderr)
        return 2
    for path, package in packages:
        if isinstance(package, str):
            models.append({"model": path.name, "path": str(path), "error": package})
        elif package.text is not None:
            models.append(_explain_language(package, config.llm))
        else:
            models.append(_explain(acc, package, args, config.engine))
    document = {
        **acc.detection.report(),
        "runtimes": acc.runtimes,
        "models_dir": str(models_dir),
        "models": models,
    }
    print(json.dumps(document, indent=2) if args.json else render(document))
    return 0 if all(m.get("chosen") for m in models) else 1


def render(doc: dict) -> str:
    """The report as text for a terminal."""
    board = doc["board"]
    lines = [
        f"board      {board['arch']}  model: {board['model'] or '-'}",
        f"           compatible: {', '.join(board['compatible']) or '-'}",
    ]
    if board["tegra_release"]:
        lines.append(f"           L4T {board['tegra_release']}  module: {board['module'] or '-'}")
    lines.append(f"           int8-relevant CPU flags: {', '.join(board['cpu_flags']) or '-'}")
    lines.append(f"           thermal zones: {', '.join(board['thermal_zones']) or '-'}")
    lines.extend(f"           note: {note}" for note in board["notes"])
    lines += [
        f"profile    {doc['profile']}: {doc['description']}",
        f"           why: {doc['reason']}",
    ]
    for entry in doc["profiles"]:
        if entry["name"] != doc["profile"]:
            verdict = "matches" if entry["matched"] else "no"
            lines.append(f"           {entry['name']}: {verdict} ({'; '.join(entry['evidence'])})")
    budget = doc["power_budget_w"]
    lines.append(
        f"           threads: {doc['threads'] or 'all cores'}; "
        f"power budget: {f'{budget:g} W' if budget else 'none'}"
    )
    if doc["thermal"]:
        sensors = [f"{t['name']} {'ok' if t['present'] else 'MISSING'}" for t in doc["thermal"]]
        lines.append(f"           thermal sensors: {', '.join(sensors)}")
    lines.extend(f"accessory  {text}" for text in doc["accessories"])
    for name, info in doc["runtimes"].items():
        if info.get("available"):
            devices = ", ".join(map(str, info.get("devices", []))) or "not loaded: no candidate"
            lines.append(f"runtime    {name} {info['version']} (lists: {devices})")
        else:
            lines.append(f"runtime    {name}: unavailable: {info.get('reason')}")
    if not doc["models"]:
        lines.append(f"models     none in {doc['models_dir']} (use --models-dir DIR)")
    for model in doc["models"]:
        lines.append("")
        if "error" in model:
            lines.append(f"model {model['model']}: invalid package: {model['error']}")
            continue
        latency = model["median_latency_ms"]
        unit = "per token" if model["mode"] == "generated" else "batch-1"
        timing = f", median {latency:.2f} ms {unit}" if latency is not None else ""
        lines.append(
            f"model {model['model']} v{model['version']}: "
            f"{model['chosen'] or 'NO WORKING CANDIDATE'}{timing}"
        )
        lines.append(f"  why: {model['reason']}")
        if model.get("plan"):
            lines.append(f"  plan: {_plan_line(model['plan'])}")
        marks = {"chosen": "*", "kept": "+", "dropped": "-"}
        for cand in model["candidates"]:
            why = f"  {cand['why']}" if cand["why"] else ""
            lines.append(f"  {marks[cand['state']]} {cand['rank']:>2} {cand['candidate']}{why}")
    return "\n".join(lines)


def _plan_line(plan: dict) -> str:
    """``2 instances x 1 thread, batch 4 (search: 845 rows/s; 2x1:b1 568, ...)``."""
    shape = PlanShape(plan["instances"], plan["threads"], plan["batch"]).text
    figures = ", ".join(f"{label} {value:g}" for label, value in plan["figures"].items())
    rate = f": {plan['rows_per_s']:g} rows/s" if plan.get("rows_per_s") else ""
    took = f" in {plan['search_ms']:.0f} ms" if plan["source"] == "search" else ""
    return f"{shape} ({plan['source']}{rate}{took}{'; ' + figures if figures else ''})"
