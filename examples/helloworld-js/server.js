// The HelloWorld sync hook (examples/helloworld) in JavaScript, taking
// and answering CloudEvents with the cloudevents package: a plain JSON
// request (upstream Metacontroller) gets a plain JSON answer, a binary or
// structured CloudEvent (what metabus sends) a CloudEvent in the same mode,
// whose data is the response. It listens on $HOST (all addresses) and
// $PORT (8080; 0 picks a free port) and prints "listening on <port>".
"use strict";

const http = require("node:http");
const { CloudEvent, HTTP } = require("cloudevents");

// sync is the tutorial's hook: one Pod that echoes the greeting, and the
// observed Pods counted in status.
function sync(request) {
  const parent = request.parent;
  if (!parent || !parent.metadata) {
    throw Object.assign(new Error("the request has no parent"), { code: 400 });
  }
  const who = (parent.spec && parent.spec.who) || "World";
  const pods = (request.children && request.children["Pod.v1"]) || {};
  return {
    status: { pods: Object.keys(pods).length },
    children: [{
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: parent.metadata.name },
      spec: {
        restartPolicy: "OnFailure",
        containers: [{ name: "hello", image: "busybox", command: ["echo", `Hello, ${who}!`] }],
      },
    }],
  };
}

const maxRequestBytes = 8 << 20; // metabus's largest request

function answer(res, code, headers, body) {
  res.writeHead(code, headers);
  res.end(body);
}

function fail(res, err) {
  const code = err.code >= 400 && err.code <= 599 ? err.code : 500;
  answer(res, code, { "content-type": "text/plain; charset=utf-8" }, String(err.message) + "\n");
}

function handle(req, res, body) {
  const contentType = String(req.headers["content-type"] || "");
  const structured = contentType.startsWith("application/cloudevents");
  if (!structured && !req.headers["ce-specversion"]) {
    // Plain JSON in, plain JSON out.
    let request;
    try {
      request = JSON.parse(body);
    } catch (e) {
      throw Object.assign(new Error(`malformed request: ${e.message}`), { code: 400 });
    }
    answer(res, 200, { "content-type": "application/json" }, JSON.stringify(sync(request)));
    return;
  }
  let event;
  try {
    event = HTTP.toEvent({ headers: req.headers, body });
  } catch (e) {
    throw Object.assign(new Error(`malformed CloudEvent: ${e.message}`), { code: 400 });
  }
  if (Array.isArray(event)) {
    throw Object.assign(new Error("batched CloudEvents are not supported"), { code: 415 });
  }
  let data = event.data;
  if (typeof data === "string" || Buffer.isBuffer(data)) {
    try {
      data = JSON.parse(data.toString());
    } catch (e) {
      throw Object.assign(new Error(`malformed request: ${e.message}`), { code: 400 });
    }
  }
  // The answer names what it answers, as metabus's SDK does: type
  // <request type>.response, the request's subject, and its id in the
  // requestid extension.
  const reply = new CloudEvent({
    type: `${event.type}.response`,
    source: req.url || "/",
    subject: event.subject,
    requestid: event.id,
    datacontenttype: "application/json",
    data: sync(data),
  });
  const message = structured ? HTTP.structured(reply) : HTTP.binary(reply);
  answer(res, 200, message.headers, typeof message.body === "string" ? message.body : JSON.stringify(message.body));
}

const server = http.createServer((req, res) => {
  if (req.method !== "POST") {
    answer(res, 405, { allow: "POST" }, "a hook is called with POST\n");
    return;
  }
  const chunks = [];
  let size = 0;
  req.on("data", (chunk) => {
    size += chunk.length;
    if (size <= maxRequestBytes) {
      chunks.push(chunk);
    } // else read on and drop it, to answer 413 at the end
  });
  req.on("end", () => {
    if (size > maxRequestBytes) {
      fail(res, Object.assign(new Error(`request above ${maxRequestBytes} bytes`), { code: 413 }));
      return;
    }
    try {
      handle(req, res, Buffer.concat(chunks).toString("utf8"));
    } catch (err) {
      fail(res, err);
    }
  });
});

server.listen(Number(process.env.PORT || 8080), process.env.HOST || "0.0.0.0", () => {
  console.log(`listening on ${server.address().port}`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
