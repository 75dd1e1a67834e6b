#!/usr/bin/env python3
"""Checks that a Herder /metrics endpoint serves valid Prometheus text.

Usage: check-metrics.py URL

Parses the body with prometheus_client's own OpenMetrics parser (the format /metrics serves) and fails (exit 1) if parsing raises,
if fewer than MIN_FAMILIES metric families come back, or if a required family is missing.
Family names are as the parser reports them: a counter's family loses its `_total` suffix.
When the server declares OpenMetrics (content-type application/openmetrics-text), the body
must also pass prometheus_client's stricter OpenMetrics parser.
"""

import importlib
import os
import site
import subprocess
import sys
import urllib.error
import urllib.request

MIN_FAMILIES = 10
REQUIRED = [
    "herder_jobs",
    "herder_submissions",
    "herder_assignments",
    "herder_stale_results_rejected",
    "herder_consensus_term",
    "herder_commit_index",
    "herder_applied_index",
]


def fail(message):
    print(f"check-metrics: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def load_parser():
    try:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
        return text_string_to_metric_families
    except ImportError:
        pass
    print("check-metrics: installing prometheus_client", file=sys.stderr)
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    attempts = [
        base + ["prometheus_client"],
        # A system Python that refuses installs outside a virtual environment.
        base + ["--user", "--break-system-packages", "prometheus_client"],
    ]
    env = dict(os.environ, PIP_ROOT_USER_ACTION="ignore")
    for command in attempts:
        if subprocess.run(command, check=False, env=env).returncode == 0:
            break
    else:
        fail("could not install prometheus_client with pip")
    user_site = site.getusersitepackages()
    if user_site not in sys.path:
        sys.path.append(user_site)
    importlib.invalidate_caches()
    try:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    except ImportError as err:
        fail(f"prometheus_client is installed but cannot be imported: {err}")
    return text_string_to_metric_families


def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            status = response.status
            content_type = response.headers.get("content-type", "")
            body = response.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        fail(f"GET {url} answered {err.code}")
    except (urllib.error.URLError, OSError) as err:
        fail(f"GET {url} failed: {err}")
    except UnicodeDecodeError as err:
        fail(f"GET {url}: the body is not UTF-8: {err}")
    if status != 200:
        fail(f"GET {url} answered {status}")
    return body, content_type


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    url = argv[1]
    parse = load_parser()
    body, content_type = fetch(url)
    try:
        families = list(parse(body))
    except Exception as err:  # the parser raises ValueError and others on malformed input
        fail(f"the body does not parse as Prometheus text: {type(err).__name__}: {err}")

    media_type = content_type.split(";")[0].strip().lower()
    if media_type == "application/openmetrics-text":
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
        try:
            om_families = list(parse_om(body))
        except Exception as err:
            fail(f"the body is served as OpenMetrics but does not parse as OpenMetrics: {type(err).__name__}: {err}")
        fmt = f"OpenMetrics, {len(om_families)} families by its parser"
    elif media_type == "text/plain":
        fmt = "Prometheus text"
    else:
        fail(f"unexpected content-type {content_type!r}")

    names = [family.name for family in families]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        fail(f"families appear more than once: {', '.join(duplicates)}")
    if len(families) < MIN_FAMILIES:
        fail(f"only {len(families)} metric families (at least {MIN_FAMILIES} expected): {', '.join(names)}")
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        fail(f"missing families: {', '.join(missing)} (found: {', '.join(sorted(names))})")

    samples = sum(len(family.samples) for family in families)
    by_type = {}
    for family in families:
        by_type[family.type] = by_type.get(family.type, 0) + 1
    types = ", ".join(f"{count} {kind}" for kind, count in sorted(by_type.items()))
    print(f"check-metrics: OK ({fmt}): {len(families)} families ({types}), {samples} samples: {', '.join(sorted(names))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
