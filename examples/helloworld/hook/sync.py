"""The HelloWorld sync hook as a plain JSON webhook, for docker-compose.yaml.

It answers as examples/helloworld/hook.go does (the e2e suite and `make run`
serve that one): one Pod per HelloWorld, echoing a greeting, and a status
counting the Pods observed. Standard library only, so that it runs on a bare
python image: `python sync.py` listens on :8080 and serves POST /sync.
"""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def sync(request):
    parent = request.get("parent", {})
    name = parent.get("metadata", {}).get("name", "")
    who = parent.get("spec", {}).get("who") or "World"
    pods = request.get("children", {}).get("Pod.v1", {})
    return {
        "status": {"pods": len(pods)},
        "children": [{
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "OnFailure",
                "containers": [{
                    "name": "hello",
                    "image": "busybox",
                    "command": ["echo", "Hello, %s!" % who],
                }],
            },
        }],
    }


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/sync":
            self.send_error(404)
            return
        length = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.dumps(sync(json.loads(self.rfile.read(length)))).encode()
        except (ValueError, AttributeError) as e:
            self.send_error(400, str(e))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        # The compose healthcheck.
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()


if __name__ == "__main__":
    ThreadingHTTPServer(("", 8080), Handler).serve_forever()
