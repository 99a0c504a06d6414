"""/openapi.json and /docs of the served app describe the two generation endpoints."""
from __future__ import annotations

import httpx

ERRORS = {"400", "401", "413", "415", "429", "503"}


def test_the_document_describes_both_generation_endpoints(server):
    doc = httpx.get(server.base_url + "/openapi.json", timeout=30).json()
    schemas = doc["components"]["schemas"]
    for path, request in (("/v1/completions", "CompletionRequest"), ("/v1/chat/completions", "ChatCompletionRequest")):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{request}"}
        assert {"model"} <= set(schemas[request]["required"]) and "stream" in schemas[request]["properties"]
        assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
        assert ERRORS <= set(op["responses"]), op["responses"].keys()
        for status in ERRORS:
            assert op["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
        assert "Retry-After" in op["responses"]["429"]["headers"]
    assert schemas["ErrorDetail"]["required"] == ["message", "type", "param", "code"]
    assert {"/v1/models", "/health", "/metrics"} <= set(doc["paths"])


def test_the_document_is_valid_openapi_and_every_schema_reference_resolves(server):
    import schemathesis

    schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    assert {(o.method.upper(), o.path) for o in ops} >= {("POST", "/v1/completions"), ("POST", "/v1/chat/completions")}


def test_the_docs_page_is_served(server):
    r = httpx.get(server.base_url + "/docs", timeout=30)
    assert r.status_code == 200 and "/openapi.json" in r.text
