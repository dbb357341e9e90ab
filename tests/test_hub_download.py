"""Hugging Face repo ids downloaded (specprobe.models.hub), offline: the real
huggingface_hub client against a hub emulated by `http.server` on 127.0.0.1, reached
through HF_ENDPOINT, serving tiny repos built from the tests' tiny models.

The emulated hub answers exactly what the installed client asks for a snapshot:
  GET  /api/models/{repo}[/revision/{rev}] the repo's info: its commit ("sha") and files
       ("siblings"); 404 with X-Error-Code RepoNotFound / RevisionNotFound, 401 / 403
       with X-Error-Code GatedRepo for a gated repo
  GET  /api/models/{repo}/tree/{commit}     the file listing (one page: no Link header)
  HEAD /{repo}/resolve/{commit}/{file}      X-Repo-Commit, ETag, Content-Length
  GET  /{repo}/resolve/{commit}/{file}      the bytes (a Range request answered 206)

huggingface_hub reads HF_HUB_OFFLINE (and HF_ENDPOINT) once, when it is imported, into
its `constants` module, and conftest sets HF_HUB_OFFLINE=1 before that for every test.
specprobe reads HF_ENDPOINT and HF_HUB_OFFLINE when it downloads, and passes the endpoint
to the client; the client's own offline switch is patched in `constants` for these tests
(as huggingface_hub's own tests patch it), which keeps them in-process and fast."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ModelLoadError
from tests.helpers.tiny import prompts_file

runner = CliRunner()
MAIN, V2 = "a" * 40, "b" * 40
DECOYS = {"README.md": b"# tiny\n", "pytorch_model.bin": b"not wanted: the safetensors are there", "original/consolidated.pth": b"not wanted"}


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]]  # commit -> {path: bytes}
    refs: dict[str, str]  # branch or tag -> commit
    gated: int | None = None  # 401 or 403: every request refused as a gated repo's


@dataclass
class Hub:
    url: str
    repos: dict[str, Repo]
    log: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request

    def file_gets(self) -> list[str]:
        return [p for m, p in self.log if m == "GET" and "/resolve/" in p]


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a stuck client never holds a server thread for long

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str) -> None:
            self._send(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code, "X-Error-Message": code, "Content-Type": "application/json"})

        def _repo(self, repo_id: str, rev: str) -> tuple[Repo, str] | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound")
                return None
            if repo.gated:
                self._error(repo.gated, "GatedRepo")
                return None
            commit = repo.refs.get(rev, rev)
            if commit not in repo.commits:
                self._error(404, "RevisionNotFound")
                return None
            return repo, commit

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            hub.log.append((self.command, path))
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if parts[:2] == ["api", "models"] and len(parts) == 4:  # the repo's info at its default branch
                parts += ["revision", "main"]
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                found = self._repo(f"{parts[2]}/{parts[3]}", parts[5])
                if found is None:
                    return
                repo, commit = found
                files = repo.commits[commit]
                if parts[4] == "revision":
                    body = {"id": f"{parts[2]}/{parts[3]}", "modelId": f"{parts[2]}/{parts[3]}", "sha": commit, "private": False, "siblings": [{"rfilename": f} for f in files]}
                else:
                    body = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()} for f, b in files.items()]  # type: ignore[assignment]
                self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
            elif len(parts) >= 5 and parts[2] == "resolve":
                found = self._repo(f"{parts[0]}/{parts[1]}", parts[3])
                if found is None:
                    return
                repo, commit = found
                name = "/".join(parts[4:])
                data = repo.commits[commit].get(name)
                if data is None:
                    self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
                    return
                headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"', "Accept-Ranges": "bytes"}
                start = int(self.headers.get("Range", "bytes=0-").split("=")[1].split("-")[0] or 0)
                if start:
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    self._send(206, data[start:], headers)
                else:
                    self._send(200, data, headers)
            else:
                self._send(404, b"")

    return Handler


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def hub(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    """The emulated hub on 127.0.0.1 (a free port), the hub cache in tmp_path, downloads
    allowed; the server is shut down when the test ends, whatever happened."""
    import huggingface_hub.constants

    repos = {
        "org/tiny-target": Repo({MAIN: {**_files(tiny_pair["target"]), **DECOYS}}, {"main": MAIN}),
        # main: the target's twin; v2: a different model
        "org/tiny-draft": Repo({MAIN: _files(tiny_pair["twin"]), V2: _files(tiny_pair["random"])}, {"main": MAIN, "v2": V2}),
        "org/gated": Repo({MAIN: _files(tiny_pair["twin"])}, {"main": MAIN}, gated=401),
        "org/forbidden": Repo({MAIN: _files(tiny_pair["twin"])}, {"main": MAIN}, gated=403),
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(Hub("", repos)))
    state = Hub(f"http://127.0.0.1:{server.server_address[1]}", repos)
    server.RequestHandlerClass = _handler(state)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", state.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read at its import: see the module's docstring
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _snapshot(tmp_path: Path, repo: str, commit: str) -> Path:
    return tmp_path / "hf" / "hub" / ("models--" + repo.replace("/", "--")) / "snapshots" / commit


def test_diagnose_downloads_then_uses_the_cache(hub: Hub, tiny_pair: dict[str, Path], tmp_path: Path) -> None:
    pf = prompts_file(tmp_path / "p.jsonl", n=2)
    args = ["diagnose", "org/tiny-target", "org/tiny-draft", "--prompts", str(pf), "--max-new-tokens", "6", "--cost-ratio", "0.1", "--json", str(tmp_path / "a.json")]
    res = runner.invoke(app, args)
    assert res.exit_code in (0, 1), res.output
    data = json.loads((tmp_path / "a.json").read_text())
    assert (data["config"]["target"], data["config"]["drafter"], data["target"]["name"]) == ("org/tiny-target", "org/tiny-draft", "tiny-target")
    assert "revision" not in data["config"] and "offline" not in data["config"]
    snap = _snapshot(tmp_path, "org/tiny-target", MAIN)
    # only what specprobe reads: the decoys (README, a .bin beside the safetensors, a sub-folder) never asked for
    assert (snap / "model.safetensors").is_file() and (snap / "tokenizer.json").is_file()
    got = {p.rsplit("/", 1)[-1] for p in hub.file_gets()}
    assert "model.safetensors" in got and not got & {"README.md", "pytorch_model.bin", "consolidated.pth"}
    assert not any(m == "GET" and "tiny-target" in p and "/api/" not in p and "original" in p for m, p in hub.log)
    # the second run: from the cache, not a single request
    hub.log.clear()
    res = runner.invoke(app, [*args[:-1], str(tmp_path / "b.json")])
    assert res.exit_code in (0, 1), res.output
    assert hub.log == []
    # check on the same repo ids, cache only as well
    res = runner.invoke(app, ["check", "org/tiny-target", "org/tiny-draft", "--json", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output
    assert hub.log == [] and json.loads((tmp_path / "c.json").read_text())["drafter"]["spec"] == "org/tiny-draft"


def test_a_revision_is_honoured(hub: Hub, tiny_pair: dict[str, Path], tmp_path: Path) -> None:
    res = runner.invoke(app, ["check", str(tiny_pair["target"]), "org/tiny-draft", "--draft-revision", "v2", "--json", str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    snap = _snapshot(tmp_path, "org/tiny-draft", V2)
    assert (snap / "model.safetensors").read_bytes() == (tiny_pair["random"] / "model.safetensors").read_bytes()
    assert (snap.parent.parent / "refs" / "v2").read_text() == V2 and not _snapshot(tmp_path, "org/tiny-draft", MAIN).exists()
    assert any(p.endswith("/revision/v2") for _, p in hub.log)
    # the cached v2 serves the next run; main is still to download
    from specprobe.models.hub import fetch

    hub.log.clear()
    assert fetch("org/tiny-draft", "v2") == snap and fetch("org/tiny-draft", V2) == snap and hub.log == []
    assert fetch("org/tiny-draft") == _snapshot(tmp_path, "org/tiny-draft", MAIN) and hub.file_gets()


@pytest.mark.parametrize(
    ("repo", "revision", "message"),
    [
        ("org/gated", None, r"^org/gated refused the download \(401\): the repo is gated or private.* — set HF_TOKEN .*accepted the licence on http://127\.0\.0\.1:\d+/org/gated"),
        ("org/forbidden", None, r"^org/forbidden refused the download \(403\).* — set HF_TOKEN"),
        ("org/absent", None, r"^org/absent not found on http://127\.0\.0\.1:\d+ \(404\) — check the repo id"),
        ("org/tiny-draft", "nope", r"^revision nope not found in org/tiny-draft on http://127\.0\.0\.1:\d+ — check the branch"),
    ],
)
def test_refusals_are_one_line_naming_the_repo(hub: Hub, tmp_path: Path, repo: str, revision: str | None, message: str) -> None:
    from specprobe.models.hub import fetch

    with pytest.raises(ModelLoadError) as e:
        fetch(repo, revision)
    assert "\n" not in e.value.one_line()
    assert __import__("re").match(message, e.value.one_line()), e.value.one_line()
    res = runner.invoke(app, ["check", repo, "self", *(["--revision", revision] if revision else [])])
    assert res.exit_code == 2 and repo in res.output, res.output


def test_offline_by_flag_or_env_refuses_to_download(hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = runner.invoke(app, ["check", "org/tiny-target", "self", "--offline"])
    assert res.exit_code == 2 and "downloads are off (--offline)" in res.output and "drop --offline" in res.output, res.output
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = runner.invoke(app, ["check", "org/tiny-target", "self"])
    assert res.exit_code == 2 and "downloads are off (HF_HUB_OFFLINE=1)" in res.output and "unset HF_HUB_OFFLINE" in res.output, res.output
    assert hub.log == []
    # once cached, offline is no obstacle
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert runner.invoke(app, ["check", "org/tiny-target", "self"]).exit_code == 0
    hub.log.clear()
    res = runner.invoke(app, ["check", "org/tiny-target", "self", "--offline"])
    assert res.exit_code == 0 and hub.log == [], res.output


def test_an_interrupted_download_resumes(hub: Hub, tmp_path: Path) -> None:
    """A snapshot the client left without a wanted file (its listing kept) is completed,
    not loaded half; offline, it is refused naming what is missing."""
    from specprobe.models.hub import fetch

    snap = fetch("org/tiny-target")
    blob = (snap / "model.safetensors").resolve()
    (snap / "model.safetensors").unlink()  # as if stopped before this file: no link, no blob
    blob.unlink()
    with pytest.raises(ModelLoadError, match=r"the cached org/tiny-target misses model\.safetensors; downloads are off \(--offline\)"):
        fetch("org/tiny-target", offline=True)
    hub.log.clear()
    assert fetch("org/tiny-target") == snap and (snap / "model.safetensors").is_file()
    assert [p.rsplit("/", 1)[-1] for p in hub.file_gets()] == ["model.safetensors"]


def test_only_what_specprobe_reads_is_wanted() -> None:
    from specprobe.models.hub import wanted

    repo = ["config.json", "tokenizer.json", "tokenizer.model", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
            "consolidated.safetensors", "pytorch_model.bin", "original/params.json", "README.md", ".gitattributes"]
    assert wanted(repo) == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer.model"]
    assert wanted(["config.json", "pytorch_model.bin", "README.md"]) == ["config.json", "pytorch_model.bin"]  # an EAGLE head
    assert wanted(["m-Q4_K_M.gguf", "README.md"]) == ["m-Q4_K_M.gguf"]
    assert wanted(["m-Q4_K_M.gguf", "m-Q8_0.gguf"]) == []  # which one is the user's to say
