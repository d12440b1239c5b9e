"""The dashboard with auth on, in headless chromium: the page asks for a key, keeps it in the tab's
sessionStorage and sends it as the bearer header on every API call; the rollout browser shows a real
job's groups side by side (verdicts with reasons, reward, advantage, length, tokens shaded by log-prob or
by engine/trainer mismatch) and its filters (zero-variance groups, truncated completions, infrastructure
failures) show exactly the completions the API holds. A screenshot of the rollout browser is kept."""
from __future__ import annotations

import json
import shutil
import threading

import httpx
import pytest

from tests.conftest import REPO, free_port, wait_for
from tests.integration.chrome import CHROMIUM, Chrome

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None,
                                 reason="Debian chromium is not installed (make test installs it as root)")]
ADMIN = "admin-key-for-the-browser-test"
SCREENSHOT = REPO / "bench" / "screenshots" / "rollout-browser.png"


def _flaky_verifier():
    """Weighted, and an infrastructure failure on every completion with a 7 in it (the retry fails too):
    those completions are left out of the update and marked `excluded`."""
    from verifiers import BaseVerifier, Status, Verdict, register
    from verifiers.registry import _registry

    class FlakySandbox(BaseVerifier):
        name, version, description = "flaky-sandbox", "1", "errors on completions containing a 7"

        def verify(self, completion, reference):
            if "7" in completion:
                return Verdict(0.0, Status.error, "sandbox unreachable (test double)")
            return Verdict(1.0, Status.correct, "ran")

    if "flaky-sandbox" not in _registry:
        register("flaky-sandbox", FlakySandbox)


def _zero_variance(group) -> bool:
    ok = [c["reward"] for c in group["completions"] if not c["excluded"]]
    return len(ok) < 2 or max(ok) - min(ok) < 1e-8


def _interesting(groups) -> bool:
    """A step whose stored groups exercise every view: a zero-variance group, a group trained on (trainer
    log-probs and the engine difference), a truncated completion and an infrastructure failure."""
    comps = [c for g in groups for c in g["completions"]]
    return (any(_zero_variance(g) for g in groups) and any(not _zero_variance(g) for g in groups)
            and any(c["truncated"] for c in comps) and any(c["excluded"] for c in comps)
            and any("logprob_diff" in c for c in comps))


@pytest.fixture(scope="module")
def served(tmp_path_factory, models_dir):
    """An auth-on API (in this process, so it knows the test's verifier), a tenant key, and a job that ran
    until one of its steps is interesting: (base url, tenant key, job id, that step, its stored groups)."""
    import uvicorn

    from service.app import create_app
    from service.jobs.runner import execute_job
    from service.settings import Settings

    _flaky_verifier()
    home = tmp_path_factory.mktemp("auth-dashboard")
    settings = Settings(home=home, models=models_dir, auth=True, admin_key=ADMIN, broker_url="memory://")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, reaper=False), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=base, timeout=10)
    worker = None
    try:
        wait_for(lambda: _up(http), 30, "the API")
        key = http.post("/v1/keys", json={"tenant": "alice"},
                        headers={"Authorization": f"Bearer {ADMIN}"}).json()["key"]
        http.headers["Authorization"] = f"Bearer {key}"
        spec = {"name": "browse-me", "verifiers": [{"name": "math"}, {"name": "flaky-sandbox", "weight": 0.1}],
                "rollout": {"group_size": 8, "max_new_tokens": 10}, "data": {"eval_size": 8},
                "train": {"steps": 300, "prompts_per_step": 2, "eval_every": 0, "threads": 1}}
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        worker = threading.Thread(target=execute_job, args=(job, settings), daemon=True)
        worker.start()
        found: dict = {}

        def look() -> bool:
            for ro in http.get(f"/v1/jobs/{job}/rollouts", params={"limit": 20}).json():
                if _interesting(ro["groups"]):
                    found.update(ro)
                    return True
            return http.get(f"/v1/jobs/{job}").json()["status"] not in ("queued", "running")

        wait_for(look, 300, "a step with every kind of rollout")
        assert found, "the job ended before any step had every kind of rollout"
        http.post(f"/v1/jobs/{job}/cancel")
        worker.join(timeout=120)
        yield base, key, job, found["step"], found["groups"]
    finally:
        if worker is not None and worker.is_alive():
            http.post(f"/v1/jobs/{job}/cancel")
            worker.join(timeout=120)
        http.close()
        server.should_exit = True


def _up(http) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def _login(chrome: Chrome, key: str, job: str) -> None:
    """Type the key into the form the page shows, and wait for the data."""
    chrome.wait("!document.getElementById('auth').hidden", 20, "the key form")
    chrome.eval(f"document.getElementById('key-input').value = {json.dumps(key)};"
                "document.querySelector('#key-form button').click(); true")
    chrome.wait(f"!!document.querySelector('tr.job[data-id=\"{job}\"]')", 30, "the job row")


def test_the_dashboard_asks_for_a_key_and_sends_it_on_every_api_call(served, tmp_path):
    base, key, job, _step, _groups = served
    with Chrome(tmp_path / "chrome") as chrome:
        chrome.goto(f"{base}/dashboard?job={job}")
        chrome.wait("!document.getElementById('auth').hidden", 20, "the key form")
        assert chrome.eval("document.body.classList.contains('locked')")
        assert chrome.eval("document.querySelectorAll('tr.job').length") == 0  # no key: no data
        assert chrome.eval("sessionStorage.length") == 0
        # a wrong key is refused and said so
        chrome.eval("document.getElementById('key-input').value = 'rlvr_wrong'; document.querySelector('#key-form "
                    "button').click(); true")
        chrome.wait("document.getElementById('auth-msg').textContent.includes('refused')", 20, "the refusal")
        assert chrome.eval("document.querySelectorAll('tr.job').length") == 0
        # the right key: the data appears, the form goes, the key lives in this tab's sessionStorage only
        _login(chrome, key, job)
        assert chrome.eval("document.getElementById('auth').hidden && !document.body.classList.contains('locked')")
        assert chrome.eval("sessionStorage.getItem('rlvr_api_key')") == key
        assert chrome.eval("localStorage.length") == 0 and key not in chrome.eval("location.href + document.cookie")
        chrome.wait("document.querySelectorAll('#charts .chart').length === 6 && "
                    "document.querySelectorAll('#rollouts .comp').length > 0", 30, "charts and rollouts")
        # a reload keeps the session's key: no second prompt
        chrome.goto(f"{base}/dashboard?job={job}")
        chrome.wait(f"!!document.querySelector('tr.job[data-id=\"{job}\"]')", 30, "the job row after a reload")
        assert chrome.eval("document.getElementById('auth').hidden")
        # every panel polls on its own timer: wait for the slowest (sessions) to have asked once, so the
        # check below is about what the calls carried, not about which timer fired first on a busy machine
        chrome.wait("performance.getEntriesByType('resource').some(e => e.name.split('?')[0].endsWith('/sessions'))",
                    30, "the sessions poll")
        api_calls = [r for r in chrome.requests() if "/v1/" in r["url"]]
        page = [r for r in chrome.requests() if r["url"].split("?")[0].endswith("/dashboard")]
        assert page
        with_key = [r for r in api_calls if r["headers"].get("Authorization") == f"Bearer {key}"]
        wrong = [r for r in api_calls if r["headers"].get("Authorization") == "Bearer rlvr_wrong"]
        without = [r["url"] for r in api_calls if "Authorization" not in r["headers"]]
        # before a key was entered the page asked once without one (that is how it learns auth is on), and
        # while it shows the key form it does not poll
        assert len(with_key) + len(wrong) + len(without) == len(api_calls) and len(without) == 1, without
        assert len(wrong) == 1
        kinds = {r["url"].split("?")[0].rsplit("/", 1)[-1] for r in with_key}
        assert kinds >= {"jobs", "metrics", "checkpoints", "events", "rollouts", "sessions"}, kinds  # keyed, all
        assert all("Authorization" not in r["headers"] for r in page)  # the page itself needs no key
        # forgetting the key locks the page again
        chrome.eval("document.getElementById('forget').click(); true")
        chrome.wait("!document.getElementById('auth').hidden", 20, "the key form again")
        assert chrome.eval("sessionStorage.getItem('rlvr_api_key')") is None


def test_the_rollout_browser_shows_groups_side_by_side_with_filters_and_shading(served, tmp_path):
    base, key, job, step, groups = served
    comps = [c for g in groups for c in g["completions"]]
    with Chrome(tmp_path / "chrome", width=1500, height=1100) as chrome:
        chrome.goto(f"{base}/dashboard?job={job}")
        _login(chrome, key, job)
        chrome.wait(f"[...document.getElementById('ro-step').options].some(o => o.value === '{step}')", 30, "the step")
        chrome.eval(f"(() => {{ const s = document.getElementById('ro-step'); s.value = '{step}';"
                    " s.dispatchEvent(new Event('change')); return true; })()")
        chrome.wait(f"document.getElementById('ro-title').textContent === '(step {step})'", 30, f"step {step}")
        dom = lambda js: chrome.eval(js)  # noqa: E731

        def shade(by: str) -> None:
            chrome.eval(f"(() => {{ const m = document.getElementById('ro-shade'); m.value = '{by}';"
                        " m.dispatchEvent(new Event('change')); return true; })()")

        assert dom("document.querySelectorAll('#rollouts .group').length") == len(groups)
        assert dom("document.querySelectorAll('#rollouts .comp').length") == len(comps)
        assert "step=" + str(step) in dom("location.search")  # a link to this view
        # side by side: the completions of a group share a row
        tops = dom("[...document.querySelector('#rollouts .comps').children].slice(0, 3).map(e => "
                   "e.getBoundingClientRect().top)")
        assert len(set(tops)) == 1, tops
        text = dom("document.getElementById('rollouts').innerText")
        assert "sandbox unreachable (test double)" in text and "flaky-sandbox: error" in text  # verdicts and reasons
        assert "advantage" in text and "length" in text
        for c in comps:
            assert f"reward {c['reward']:.3f}" in text and f"length {c['length']}" in text
        # shading by log-prob: exactly the tokens that have one, each with a colour
        want = sum(len(c.get("logprobs", [])) for c in comps)
        assert want > 0 and dom("document.querySelectorAll('#rollouts .tok.shaded').length") == want
        assert dom("[...document.querySelectorAll('#rollouts .tok.shaded')].every(s => "
                   "s.style.background.startsWith('rgba'))")
        assert dom("document.querySelectorAll('#rollouts .tok').length") == sum(len(c["tokens"]) for c in comps)
        chrome.screenshot(tmp_path / "rollout-browser.png", "#ro-panel")
        # shading by engine − trainer mismatch: the trained rows' tokens
        shade("mismatch")
        want = sum(len(c.get("logprob_diff", [])) for c in comps)
        assert want > 0 and dom("document.querySelectorAll('#rollouts .tok.shaded').length") == want
        assert "engine − trainer" in dom("document.querySelector('.tok.shaded').title")
        shade("none")
        assert dom("document.querySelectorAll('#rollouts .tok.shaded').length") == 0

        def only(box: str) -> None:
            for other in ("f-zero", "f-trunc", "f-infra"):
                chrome.eval(f"(() => {{ const b = document.getElementById('{other}');"
                            f" if (b.checked !== {str(other == box).lower()}) b.click(); return true; }})()")

        only("f-zero")  # zero-variance groups only
        zero = [g for g in groups if _zero_variance(g)]
        assert dom("document.querySelectorAll('#rollouts .group').length") == len(zero) < len(groups)
        assert dom("[...document.querySelectorAll('#rollouts .group')].every(g => g.dataset.zeroVariance === 'true')")
        assert dom("document.querySelectorAll('#rollouts .badge.zero').length") == len(zero)
        only("f-trunc")  # truncated completions only
        truncated = [c for c in comps if c["truncated"]]
        assert dom("document.querySelectorAll('#rollouts .comp').length") == len(truncated) < len(comps)
        assert dom("[...document.querySelectorAll('#rollouts .comp')].every(c => c.dataset.truncated === 'true')")
        only("f-infra")  # infrastructure failures only
        excluded = [c for c in comps if c["excluded"]]
        assert dom("document.querySelectorAll('#rollouts .comp').length") == len(excluded) < len(comps)
        assert dom("[...document.querySelectorAll('#rollouts .comp')].every(c => c.dataset.excluded === 'true' "
                   "&& c.querySelector('.badge.infra'))")
        assert "filter=infra" in dom("location.search")
        only("none")
        assert dom("document.querySelectorAll('#rollouts .comp').length") == len(comps)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tmp_path / "rollout-browser.png", SCREENSHOT)  # the README shows it
    assert (tmp_path / "rollout-browser.png").stat().st_size > 10_000
