"""``python -m specstudy.environments``: install an engine's environment, print its interpreter,
refresh the committed engine requirements."""

from __future__ import annotations

import argparse
import json
import sys

from . import install as envs


def _build(args: argparse.Namespace) -> bool | None:
    return True if args.cuda else False if args.cpu else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specstudy.environments", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    engines = sorted({e.engine for e in envs.ENVIRONMENTS.values()})
    for name, help_ in (
        ("install", "create the engine's venv (once; a stamp file afterwards)"),
        ("python-of", "print the engine venv's interpreter path"),
        ("status", "say whether the engine venv is installed, as JSON"),
    ):
        s = sub.add_parser(name, help=help_)
        s.add_argument("engine", choices=engines)
        g = s.add_mutually_exclusive_group()
        g.add_argument("--cpu", action="store_true", help="the CPU build (default: CUDA when nvidia-smi sees a GPU)")
        g.add_argument("--cuda", action="store_true", help="the CUDA build")
        if name == "install":
            s.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    r = sub.add_parser("requirements", help="check or refresh environments/requirements/*.txt against the index")
    r.add_argument("--refresh", action="store_true", help="rewrite the files from the index (network)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "requirements":
        for env in envs.ENVIRONMENTS.values():
            if args.refresh:
                print(envs.write_requirements(env))
            else:
                header, reqs = envs.read_requirements(env)
                print(f"{env.requirements_file}: {len(reqs)} requirements ({header[:80]})")
        return 0
    try:
        env = envs.engine_env(args.engine, _build(args))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.cmd == "python-of":
        print(envs.python_of(env))
    elif args.cmd == "status":
        print(
            json.dumps(
                {
                    "env": env.name,
                    "python": str(envs.python_of(env)),
                    "installed": envs.is_installed(env),
                    "stamp": (envs.read_stamp(env) or {}).get("engine_version"),
                }
            )
        )
    else:
        res = envs.install(env, force=args.force)
        print(f"{env.name}: {'installed' if res.installed else 'up to date'} -> {res.python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
