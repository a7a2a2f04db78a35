"""Export for file provisioning, the type check against Grafana's schema, and push over the
HTTP API (against a fake Grafana that answers as Grafana's HTTP API documents)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import boards
from dashboards.provision import GrafanaError, export_dashboards, push_dashboards
from dashboards.typecheck import SCHEMA_DIR, DashboardTypeError, typecheck_dashboards
from monitor.cli.main import main as monitor_main

UIDS = ["vigil-overview", "vigil-recall", "vigil-rl-health"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("grafana")
    export_dashboards(out, "http://prom.example:9090", dashboards_path="/var/lib/vigil")
    return out


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_export_is_byte_identical_across_runs(exported: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    written = export_dashboards(again, "http://prom.example:9090", dashboards_path="/var/lib/vigil")
    assert sorted(str(p.relative_to(again)) for p in written) == sorted([
        *(f"dashboards/{u}.json" for u in UIDS),
        "provisioning/dashboards/vigil.yaml", "provisioning/datasources/vigil.yaml",
        "prometheus/vigil-alerts.yaml"])
    assert _tree(again) == _tree(exported)
    export_dashboards(again, "http://prom.example:9090", dashboards_path="/var/lib/vigil")
    assert _tree(again) == _tree(exported)  # overwriting changes nothing either
    text = (exported / "dashboards" / "vigil-recall.json").read_text()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    model = json.loads(text)
    assert text == json.dumps(model, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert model == boards.build_dashboards()["vigil-recall"]


def test_provisioning_files_parse_with_the_expected_providers(exported: Path) -> None:
    dash = yaml.safe_load((exported / "provisioning/dashboards/vigil.yaml").read_text())
    assert dash["apiVersion"] == 1
    [provider] = dash["providers"]
    assert provider["type"] == "file" and provider["folder"] == "vigil"
    assert provider["options"]["path"] == "/var/lib/vigil"
    ds = yaml.safe_load((exported / "provisioning/datasources/vigil.yaml").read_text())
    assert ds["apiVersion"] == 1
    [source] = ds["datasources"]
    assert source["uid"] == "vigil-prometheus" and source["type"] == "prometheus"
    assert source["url"] == "http://prom.example:9090" and source["access"] == "proxy"
    for uid in UIDS:  # the dashboards default to that data source
        model = json.loads((exported / "dashboards" / f"{uid}.json").read_text())
        [var] = [v for v in model["templating"]["list"] if v["name"] == "datasource"]
        assert var["current"]["value"] == source["uid"]


def test_default_dashboards_path_is_the_absolute_export_folder(tmp_path: Path) -> None:
    export_dashboards(tmp_path / "g")
    dash = yaml.safe_load((tmp_path / "g/provisioning/dashboards/vigil.yaml").read_text())
    assert dash["providers"][0]["options"]["path"] == str((tmp_path / "g/dashboards").resolve())
    ds = yaml.safe_load((tmp_path / "g/provisioning/datasources/vigil.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"


# ---------------------------------------------------------------------------------------------
# the type check


def _require_schema() -> None:
    if not (SCHEMA_DIR / "node_modules" / "@grafana" / "schema").is_dir():
        pytest.fail(f"Grafana's schema types are not installed in {SCHEMA_DIR / 'node_modules'}: "
                    "run `make install` (it runs `npm ci` in dashboards/schema)")


def test_schema_packages_are_pinned() -> None:
    pkg = json.loads((SCHEMA_DIR / "package.json").read_text())
    assert pkg["devDependencies"]["typescript"] == "5.9.3"
    assert re.fullmatch(r"11\.6\.\d+", pkg["devDependencies"]["@grafana/schema"])
    lock = json.loads((SCHEMA_DIR / "package-lock.json").read_text())
    got = lock["packages"]["node_modules/@grafana/schema"]["version"]
    assert got == pkg["devDependencies"]["@grafana/schema"]


def test_every_dashboard_type_checks_and_broken_ones_fail(exported: Path, tmp_path: Path) -> None:
    """All dashboards pass tsc against @grafana/schema; three broken ones fail, each with
    tsc's error pointing at the broken line of the JSON. One tsc run for each."""
    _require_schema()
    good = [exported / "dashboards" / f"{u}.json" for u in UIDS]
    typecheck_dashboards(good, SCHEMA_DIR)

    model = json.loads(good[0].read_text())
    broken = {
        "panels": {**model, "panels": "nope"},
        "gridpos": {**model, "panels": [{**model["panels"][1], "gridPos": {
            "x": "a", "y": 0, "w": 4, "h": 4}}]},
        "option": {**model, "panels": [{**model["panels"][1], "options": {
            **model["panels"][1]["options"], "colorMode": "rainbow"}}]},
    }
    files = []
    for name, bad in broken.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(bad, indent=2))
        files.append(path)
    with pytest.raises(DashboardTypeError) as err:
        typecheck_dashboards(files, SCHEMA_DIR)
    msg = str(err.value)
    for path in files:
        assert re.search(rf"{re.escape(str(path))}:\d+:\d+: error TS\d+", msg), msg
    assert "'string' is not assignable to type 'number'" in msg  # gridPos.x
    assert '"rainbow"' in msg


def test_type_check_without_node_modules_says_to_install(tmp_path: Path) -> None:
    (tmp_path / "package.json").write_text("{}")
    with pytest.raises(DashboardTypeError, match="make install"):
        typecheck_dashboards([tmp_path / "x.json"], tmp_path)


# ---------------------------------------------------------------------------------------------
# push, against a fake Grafana HTTP API

TOKEN = "glsa_admin"  # may do everything
EDITOR = "glsa_editor"  # may not read or create data sources (Grafana's default Editor role)
VIEWER = "glsa_viewer"  # may only read


@dataclass
class FakeGrafana:
    """The part of Grafana's HTTP API that a push uses, checking requests as Grafana does."""

    url: str = ""
    datasources: dict[str, dict[str, Any]] = field(default_factory=dict)
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # malformed requests seen
    is_grafana: bool = True  # False: answer like some other web server
    next_id: int = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def handle(self, method: str, path: str, headers: Any,
               body: Any) -> tuple[int, Any]:
        self.requests.append((method, path))
        if path == "/api/health" and method == "GET":  # Grafana answers it without a token
            if not self.is_grafana:
                return 404, "404 page not found"
            return 200, {"commit": "d3e4f5a", "database": "ok", "version": "11.6.0"}
        auth = headers.get("Authorization", "")
        if auth not in (f"Bearer {TOKEN}", f"Bearer {EDITOR}", f"Bearer {VIEWER}"):
            return 401, {"message": "Unauthorized", "messageId": "auth.unauthorized",
                         "statusCode": 401, "traceID": ""}
        if method in ("POST", "PUT"):
            if not headers.get("Content-Type", "").startswith("application/json"):
                self.errors.append(f"{method} {path}: not JSON")
                return 400, {"message": "bad request data"}
            if auth == f"Bearer {VIEWER}":
                return 403, {"accessErrorId": "ACE0000000001", "title": "Access denied",
                             "message": "You'll need additional permissions to perform this "
                             "action. Permissions needed: any of datasources:create"}
        if auth == f"Bearer {EDITOR}" and path.startswith("/api/datasources"):
            return 403, {"accessErrorId": "ACE0000000002", "title": "Access denied",
                         "message": "You'll need additional permissions to perform this "
                         "action. Permissions needed: datasources:read"}
        m = re.fullmatch(r"/api/datasources/uid/([\w-]+)", path)
        if m and method == "GET":
            ds = self.datasources.get(m[1])
            return (200, ds) if ds else (404, {"message": "Data source not found"})
        if m and method == "PUT":
            ds = self.datasources.get(m[1])
            if ds is None:
                return 404, {"message": "Data source not found"}
            for key in ("name", "type", "access", "url"):
                if not isinstance(body.get(key), str):
                    self.errors.append(f"PUT datasource without {key}")
                    return 400, {"message": "bad request data"}
            ds.update({k: body[k] for k in ("name", "type", "access", "url", "jsonData")
                       if k in body})
            ds["version"] += 1
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource updated",
                         "name": ds["name"]}
        if path == "/api/datasources" and method == "POST":
            for key in ("name", "type", "access", "url", "uid"):
                if not isinstance(body.get(key), str) or not body[key]:
                    self.errors.append(f"POST datasource without {key}")
                    return 400, {"message": "bad request data"}
            if body["access"] not in ("proxy", "direct"):
                self.errors.append("bad access mode")
                return 400, {"message": "bad request data"}
            if body["uid"] in self.datasources or any(
                    d["name"] == body["name"] for d in self.datasources.values()):
                return 409, {"message": "data source with the same name already exists"}
            ds = {"id": self._id(), "orgId": 1, "version": 1, "readOnly": False,
                  "basicAuth": False, "isDefault": bool(body.get("isDefault")),
                  "jsonData": body.get("jsonData", {}),
                  **{k: body[k] for k in ("name", "type", "access", "url", "uid")}}
            self.datasources[ds["uid"]] = ds
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource added",
                         "name": ds["name"]}
        if path == "/api/folders" and method == "GET":
            return 200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]}
                         for f in self.folders.values()]
        if path == "/api/folders" and method == "POST":
            if not isinstance(body.get("title"), str) or not body["title"]:
                self.errors.append("POST folder without title")
                return 400, {"message": "bad request data"}
            uid = body.get("uid") or f"f{self._id()}"
            if uid in self.folders:
                return 409, {"message": "a folder with the same uid already exists"}
            f = {"id": self._id(), "uid": uid, "title": body["title"],
                 "url": f"/dashboards/f/{uid}/{body['title'].lower()}", "version": 1,
                 "hasAcl": False, "canSave": True, "canEdit": True, "canAdmin": True}
            self.folders[uid] = f
            return 200, f
        if path == "/api/dashboards/db" and method == "POST":
            dash = body.get("dashboard")
            if not isinstance(dash, dict) or not dash.get("title"):
                self.errors.append("POST dashboard without dashboard.title")
                return 400, {"message": "Dashboard title cannot be empty"}
            if not isinstance(body.get("overwrite"), bool):
                self.errors.append("POST dashboard without overwrite")
            folder = body.get("folderUid")
            if folder not in self.folders:
                return 400, {"message": "folder not found"}
            uid = str(dash.get("uid", ""))
            old = self.dashboards.get(uid)
            if old is not None and not body["overwrite"]:
                return 412, {"message": "A dashboard with the same uid already exists",
                             "status": "name-exists"}
            version = old["version"] + 1 if old else 1
            self.dashboards[uid] = {"dashboard": dash, "folderUid": folder,
                                    "version": version, "id": old["id"] if old else self._id()}
            slug = re.sub(r"[^a-z0-9]+", "-", dash["title"].lower()).strip("-")
            return 200, {"id": self.dashboards[uid]["id"], "uid": uid, "status": "success",
                         "version": version, "slug": slug, "url": f"/d/{uid}/{slug}",
                         "folderUid": folder}
        self.errors.append(f"unexpected {method} {path}")
        return 404, {"message": "Not found"}


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                fake.errors.append(f"{self.command} {self.path}: invalid JSON")
                body = None
            path = self.path.split("?", 1)[0]
            status, payload = fake.handle(self.command, path, self.headers, body)
            text = isinstance(payload, str)
            data = payload.encode() if text else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()


def test_push_creates_what_is_missing_then_updates_in_place(grafana: FakeGrafana) -> None:
    first = push_dashboards(grafana.url, TOKEN, prometheus_url="http://prom:9090")
    assert (first.datasource, first.folder) == ("created", "created")
    assert grafana.datasources["vigil-prometheus"]["url"] == "http://prom:9090"
    assert grafana.datasources["vigil-prometheus"]["type"] == "prometheus"
    assert [f["title"] for f in grafana.folders.values()] == ["vigil"]
    assert sorted(grafana.dashboards) == UIDS
    built = boards.build_dashboards()
    for uid, saved in grafana.dashboards.items():
        assert saved["folderUid"] == first.folder_uid and saved["version"] == 1
        assert {k: v for k, v in saved["dashboard"].items() if k != "id"} == built[uid]
    assert [d.url for d in first.dashboards] == [
        f"{grafana.url}/d/{u}/{re.sub(r'[^a-z0-9]+', '-', built[u]['title'].lower()).strip('-')}"
        for u in UIDS]

    grafana.requests.clear()
    second = push_dashboards(grafana.url, TOKEN, prometheus_url=None)
    assert (second.datasource, second.folder) == ("found", "found")
    assert second.folder_uid == first.folder_uid
    assert [d.version for d in second.dashboards] == [2, 2, 2]  # overwritten, not duplicated
    assert ("POST", "/api/datasources") not in grafana.requests
    assert ("POST", "/api/folders") not in grafana.requests
    assert len(grafana.datasources) == 1 and len(grafana.folders) == 1

    third = push_dashboards(grafana.url, TOKEN, prometheus_url="http://prom-2:9090")
    assert third.datasource == "updated"
    assert grafana.datasources["vigil-prometheus"]["url"] == "http://prom-2:9090"
    assert not grafana.errors, grafana.errors


def test_push_into_an_existing_folder_by_name(grafana: FakeGrafana) -> None:
    grafana.folders["abc123"] = {"id": 99, "uid": "abc123", "title": "Safety"}
    got = push_dashboards(grafana.url, TOKEN, prometheus_url=None, folder="Safety")
    assert got.folder == "found" and got.folder_uid == "abc123"
    assert {d["folderUid"] for d in grafana.dashboards.values()} == {"abc123"}
    assert grafana.datasources["vigil-prometheus"]["url"] == "http://prometheus:9090"
    assert not grafana.errors, grafana.errors


def test_push_with_a_token_that_may_not_read_data_sources(grafana: FakeGrafana) -> None:
    got = push_dashboards(grafana.url, EDITOR, prometheus_url=None)
    assert got.datasource == "unchecked" and got.folder == "created"
    assert sorted(grafana.dashboards) == UIDS and grafana.datasources == {}
    assert ("POST", "/api/datasources") not in grafana.requests
    assert not grafana.errors, grafana.errors


def test_push_failures_are_one_clear_sentence(grafana: FakeGrafana) -> None:
    with pytest.raises(GrafanaError) as err:
        push_dashboards(grafana.url, "glsa_wrong", prometheus_url=None)
    assert str(err.value) == (f"Grafana at {grafana.url} rejected the token (HTTP 401) while "
                              "trying to read the data source: check --token or $GRAFANA_TOKEN")
    with pytest.raises(GrafanaError, match=r"denied the token permission to create the "
                       r"Prometheus data source \(HTTP 403\)"):
        push_dashboards(grafana.url, VIEWER, prometheus_url=None)
    push_dashboards(grafana.url, TOKEN, prometheus_url=None)
    grafana.datasources["vigil-prometheus"]["readOnly"] = True  # provisioned from a file
    with pytest.raises(GrafanaError, match=r"provisioned from a file \(read-only\)"):
        push_dashboards(grafana.url, TOKEN, prometheus_url="http://elsewhere:9090")
    grafana.datasources.clear()
    grafana.dashboards.clear()
    grafana.datasources["other"] = {"uid": "other", "name": boards.DATASOURCE_NAME}
    with pytest.raises(GrafanaError, match=r"answered HTTP 409 when trying to create the "
                       r"Prometheus data source: data source with the same name"):
        push_dashboards(grafana.url, TOKEN, prometheus_url=None)
    with pytest.raises(GrafanaError, match=r"^cannot reach Grafana at http://127\.0\.0\.1:9: "
                       r"Connection refused$"):
        push_dashboards("http://127.0.0.1:9", TOKEN, prometheus_url=None, timeout_s=2)
    grafana.is_grafana = False
    with pytest.raises(GrafanaError, match=r"answered HTTP 404 when trying to check its health"):
        push_dashboards(grafana.url, TOKEN, prometheus_url=None)
    assert grafana.dashboards == {}


def test_cli_export_and_push(grafana: FakeGrafana, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "grafana"
    assert monitor_main(["dashboards", "export", "--out", str(out),
                         "--prometheus-url", "http://127.0.0.1:9090"]) == 0
    assert sorted(p.name for p in (out / "dashboards").iterdir()) == [f"{u}.json" for u in UIDS]
    assert "GF_PATHS_PROVISIONING=" in capsys.readouterr().out

    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert monitor_main(["dashboards", "push", "--url", grafana.url]) == 0
    printed = capsys.readouterr().out
    assert f"Grafana 11.6.0 at {grafana.url}" in printed
    assert "data source vigil-prometheus: created" in printed
    assert f"dashboard vigil-recall: {grafana.url}/d/vigil-recall/" in printed

    assert monitor_main(["dashboards", "push", "--url", grafana.url, "--token", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("monitor dashboards: Grafana at ") and "HTTP 401" in err
    assert len(err.splitlines()) == 1
    monkeypatch.delenv("GRAFANA_TOKEN")
    monkeypatch.delenv("GRAFANA_URL", raising=False)
    assert monitor_main(["dashboards", "push"]) == 2
    assert "pass --url or set GRAFANA_URL" in capsys.readouterr().err
