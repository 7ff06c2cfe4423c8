#!/usr/bin/env python3
"""A fault-injecting HTTP proxy in front of an S3 server, for the S3 client tests.

    fault_proxy.py UPSTREAM_PORT BODY_DIR [--secret SECRET]

Listens on 127.0.0.1 (a free port, printed on stdout once listening) and
forwards every request to 127.0.0.1:UPSTREAM_PORT as it came, Host header
included, so that SigV4 signatures stay valid. It serves until stdin closes.

With --secret, it first checks each request's SigV4 signature as S3 does,
with botocore's S3 signer over the request as received (raw path and query,
the headers the request says it signed), and answers 403
SignatureDoesNotMatch to a request that fails. (moto's own check, under
moto_server.py --auth, canonicalises the path after its web framework has
decoded and re-quoted it, and so refuses correctly signed keys with
characters such as '+', '=', '!', '/' in a query value or non-ASCII.)

Commands on stdin, one a line, each answered by "ok" (or "error: WHY") on
stdout:

  fail STATUS CODE COUNT [METHOD [PART]]
                                   answer the next COUNT requests (with METHOD,
                                   or any; whose target, path and query,
                                   contains PART, or any) with STATUS and an
                                   S3 <Error> of CODE, without forwarding them
  drop COUNT [METHOD [PART]]       break the next COUNT requests: a GET is
                                   forwarded and its answer cut off after half
                                   the body; any other request is read whole
                                   and its connection closed unanswered (not
                                   forwarded)
  lose COUNT [METHOD [PART]]       forward the next COUNT requests, then close
                                   their connections unanswered: the server
                                   did the work, the client never hears of it
  log                              print one line per request received so
                                   far, then "ok"

Log lines are tab-separated fields:
  seq method target client_port action body_bytes body_file
  x-amz-checksum-crc32c x-amz-content-sha256 signed_headers header_names
action is forward, fail, drop, lose or badsig; body_file holds the request body
as received (BODY_DIR/SEQ, "-" for none), for checking checksum headers
against; signed_headers come from the Authorization header; header_names
are the names of every header received (lowercase, ';'-joined). Absent
values are "-". A request's line is logged before it is answered.
"""
import argparse
import http.client
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te",
              "upgrade"}


class Faults:
    """The faults still to inject and the request log, shared by all threads."""

    def __init__(self, body_dir):
        self.lock = threading.Lock()
        self.rules = []  # [kind, remaining, method, status, code, part]
        self.lines = []
        self.body_dir = Path(body_dir)

    def add(self, kind, count, method, status=0, code="", part=None):
        with self.lock:
            self.rules.append([kind, count, method, status, code, part])

    def take(self, method, target):
        """The fault for a request with `method` and `target`: (kind, status, code)."""
        with self.lock:
            for rule in self.rules:
                if rule[1] > 0 and rule[2] in (None, method) and (rule[5] or "") in target:
                    rule[1] -= 1
                    return rule[0], rule[3], rule[4]
        return "forward", 0, ""

    def log(self, handler, action, body):
        with self.lock:
            seq = len(self.lines)
            body_file = "-"
            if body:
                body_file = str(self.body_dir / str(seq))
                Path(body_file).write_bytes(body)
            h = handler.headers
            signed = re.search(r"SignedHeaders=([^,\s]+)", h.get("Authorization", ""))
            fields = [seq, handler.command, handler.path, handler.client_address[1], action,
                      len(body), body_file, h.get("x-amz-checksum-crc32c", "-"),
                      h.get("x-amz-content-sha256", "-"), signed.group(1) if signed else "-",
                      ";".join(k.lower() for k in h.keys())]
            self.lines.append("\t".join(str(f) for f in fields))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the client can reuse connections
    faults = None
    upstream = 0
    secret = None

    def log_message(self, *args):
        pass

    def handle_any(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.secret is not None and not signature_matches(self, self.secret):
            kind, status, code = "badsig", 403, "SignatureDoesNotMatch"
        else:
            kind, status, code = self.faults.take(self.command, self.path)
        self.faults.log(self, kind, body)
        if kind in ("fail", "badsig"):
            self.reply_error(status, code)
        elif kind == "drop" and self.command != "GET":
            self.close_connection = True  # nothing answered: the client sees an empty reply
        elif kind == "lose":
            self.forward(body)
            self.close_connection = True
        else:
            self.reply(*self.forward(body), cut=(kind == "drop"))

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_any

    def forward(self, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=120)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    conn.putheader(name, value)
            conn.endheaders(body or None)
            resp = conn.getresponse()
            return resp.status, resp.reason, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def reply(self, status, reason, headers, data, cut=False):
        self.send_response_only(status, reason)
        length = str(len(data))
        for name, value in headers:
            if name.lower() == "content-length" and self.command == "HEAD":
                length = value  # HEAD: the object's length, no body
            elif name.lower() not in HOP_BY_HOP | {"content-length"}:
                self.send_header(name, value)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data[:len(data) // 2] if cut else data)
        if cut:
            self.wfile.flush()
            self.close_connection = True

    def reply_error(self, status, code):
        body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>"
                f"<Message>injected by fault_proxy</Message></Error>").encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def signature_matches(handler, secret):
    """Whether the request's SigV4 signature is right for `secret`."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    match = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/\d{8}/([^/]+)/([^/]+)/aws4_request,"
                         r" ?SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})",
                         handler.headers.get("Authorization", ""))
    if not match:
        return False
    key_id, region, service, signed, signature = match.groups()
    headers = {name: handler.headers.get(name, "") for name in signed.split(";")}
    url = "http://" + handler.headers["Host"] + handler.path
    request = AWSRequest(method=handler.command, url=url, headers=headers)
    request.context["timestamp"] = handler.headers.get("X-Amz-Date", "")
    signer = S3SigV4Auth(Credentials(key_id, secret), service, region)
    string_to_sign = signer.string_to_sign(request, signer.canonical_request(request))
    return signer.signature(string_to_sign, request) == signature


def run_command(faults, words):
    """Applies one stdin command; returns the lines to answer."""
    def optional(i):
        return words[i] if len(words) > i else None

    if words[0] == "fail" and len(words) in (4, 5, 6):
        faults.add("fail", int(words[3]), optional(4), int(words[1]), words[2], optional(5))
    elif words[0] in ("drop", "lose") and len(words) in (2, 3, 4):
        faults.add(words[0], int(words[1]), optional(2), part=optional(3))
    elif words == ["log"]:
        with faults.lock:
            return list(faults.lines) + ["ok"]
    else:
        return ["error: unknown command " + " ".join(words)]
    return ["ok"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("upstream_port", type=int)
    parser.add_argument("body_dir")
    parser.add_argument("--secret", help="refuse requests not signed with this secret key")
    args = parser.parse_args()
    Handler.upstream = args.upstream_port
    Handler.faults = Faults(args.body_dir)
    Handler.secret = args.secret
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    for line in sys.stdin:
        if line.split():
            print("\n".join(run_command(Handler.faults, line.split())), flush=True)
    server.shutdown()


if __name__ == "__main__":
    main()
