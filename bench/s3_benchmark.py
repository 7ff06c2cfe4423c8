#!/usr/bin/env python3
"""shardsafe on S3 against a raw transfer and DCP over S3: one local server, one run, one state.

    python3 bench/s3_benchmark.py                      # 512 MiB, 1 rep, layouts of 1 and 4 objects
    python3 bench/s3_benchmark.py --size-mib 128 --reps 2 --json out.json
    python3 bench/s3_benchmark.py --objects 4 --no-reshard

Starts moto's S3 server on 127.0.0.1 (tests/s3/moto_server.py) and, in front of it, a
pass-through proxy that counts every request and byte (this file, --proxy); every client of
every row reaches the server through the proxy (AWS_ENDPOINT_URL). The state is 16 MiB tensors,
F32 [2048, 2048] and BF16 [2048, 4096] in turn, --size-mib in all. For each layout of
--objects data objects per checkpoint, rep by rep:

  shardsafe   save to s3:// (defaults; max_file_bytes = size / objects for more than one),
              load into same-shape tensors; on the first layout also resharded loads in gloo
              processes (DTensor): 2 ranks each loading half the columns of every matrix
              (Shard(1)), 3 ranks loading uneven row ranges (Shard(0))
  raw         the state's bytes as that many objects, uploaded and downloaded from / to memory
              by boto3's transfer manager (s3transfer) at shardsafe's defaults: 16 MiB parts,
              4 parts in flight per file and 16 threads at most on upload
              (S3FileOptions), 4 ranged GETs in flight on download (LoadOptions.io_threads)
  DCP         torch.distributed.checkpoint through s3torchconnector (S3StorageWriter /
              S3StorageReader, path style, 16 MiB parts) and through fsspec / s3fs
              (FsspecWriter / FsspecReader, 16 MiB blocks), thread_count = objects (a file per
              thread); save, load, and on the first layout the 2-rank Shard(1) load

Every load is compared with the state byte for byte. moto keeps objects in one Python
process and moves tens of MiB/s, so times measure protocol overhead (requests, round trips,
copies) on a server slower than any client, not storage speed; it also reads a whole object
for every ranged GET, so only rows of one layout compare. Request and byte counts do not
depend on the server. A peer that fails is reported with its error.

Needs the package built from this tree (`pip install .`), moto[server] and boto3
(requirements-dev.txt), and for the peers, which the tests do not need:
    pip install "s3torchconnector[dcp]==1.5.0" "s3fs==2026.9.0"
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gc
import http.client
import io
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MIB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "bench"
REGION = "us-east-1"
KEY_ID, SECRET = "bench-key", "bench-secret"
# shardsafe's defaults: S3FileOptions (src/s3/s3_file_system.h) and LoadOptions.io_threads.
PART = 16 * MIB
UPLOADS_PER_FILE = 4
UPLOAD_THREADS = 16
READS_IN_FLIGHT = 4
TENSOR_BYTES = 16 * MIB
ROWS = 2048
TARGET_RAW, TARGET_DCP, TARGET_OVERREAD = 0.9, 1.5, 1.1

# ------------------------------------------------------------------ proxy --

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te",
              "upgrade", "expect"}  # Expect: this proxy answers 100 Continue itself
BLOCK = MIB
# Keys of data objects (shardsafe's data files, DCP's, the raw rows'); the rest is metadata.
DATA_OBJECT = re.compile(r"/data-[^/]*\.safetensors$|\.distcp$|/raw/")


class Tally:
    """Requests by method (and how many were to data objects) and payload bytes each way,
    since the last take()."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.requests, self.up, self.down = collections.Counter(), 0, 0
        self.renamed, self.data_requests = 0, 0

    def add(self, method=None, target="", up=0, down=0, renamed=False):
        with self.lock:
            if method:
                self.requests[method] += 1
                self.data_requests += bool(DATA_OBJECT.search(target.split("?")[0]))
            self.up += up
            self.down += down
            self.renamed += renamed

    def take(self) -> dict:
        with self.lock:
            out = {"requests": dict(self.requests), "up": self.up, "down": self.down,
                   "renamed": self.renamed, "data_requests": self.data_requests}
            self.reset()
        return out


class CountingProxy(BaseHTTPRequestHandler):
    """Forwards each request to the upstream port as it came (Host included, so signatures
    hold), streaming bodies both ways, and counts it."""

    protocol_version = "HTTP/1.1"
    upstream = 0
    tally: Tally

    def log_message(self, *args):
        pass

    def handle_any(self):
        self.tally.add(self.command, self.path)
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=600)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    conn.putheader(name, value)
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            if chunked:
                conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            if chunked:
                self.relay_chunked_request(conn)
            else:
                self.relay_bytes(int(self.headers.get("Content-Length", 0)), conn)
            self.relay_response(conn.getresponse())
        finally:
            conn.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_any

    def relay_bytes(self, n, conn):
        while n > 0:
            data = self.rfile.read(min(BLOCK, n))
            if not data:
                raise ConnectionError("client closed mid-body")
            conn.send(data)
            self.tally.add(up=len(data))
            n -= len(data)

    def relay_chunked_request(self, conn):
        while True:
            line = self.rfile.readline()
            conn.send(line)
            size = int(line.split(b";")[0], 16)
            if size == 0:
                break
            self.relay_bytes(size, conn)
            conn.send(self.rfile.readline())  # the CRLF after the chunk
        while True:  # trailers, then the empty line
            line = self.rfile.readline()
            conn.send(line)
            if line in (b"\r\n", b"\n", b""):
                break

    def relay_response(self, resp):
        self.send_response_only(resp.status, resp.reason)
        no_body = self.command == "HEAD" or resp.status in (204, 304)
        for name, value in resp.getheaders():
            if name.lower() not in HOP_BY_HOP and (no_body or name.lower() != "content-length"):
                self.send_header(name, value)
        if no_body:
            self.end_headers()
            return
        if self.command == "POST" and "uploadId=" in self.path:
            return self.relay_completion(resp.read())
        if resp.length is not None:
            self.send_header("Content-Length", str(resp.length))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while data := resp.read(BLOCK):
            self.wfile.write(data if resp.length is not None
                             else b"%x\r\n%s\r\n" % (len(data), data))
            self.tally.add(down=len(data))
        if resp.length is None:
            self.wfile.write(b"0\r\n\r\n")

    def relay_completion(self, body):
        """A CompleteMultipartUpload answer, its root element named as S3 names it: moto 5.2
        writes CompleteMultipartUploadResponse (getmoto/moto#10055), where clients that read
        the ETag from CompleteMultipartUploadResult (the AWS CRT under s3torchconnector) fail."""
        fixed = body.replace(b"CompleteMultipartUploadResponse", b"CompleteMultipartUploadResult")
        self.send_header("Content-Length", str(len(fixed)))
        self.end_headers()
        self.wfile.write(fixed)
        self.tally.add(down=len(fixed), renamed=fixed != body)


def serve_proxy(upstream: int) -> None:
    """Runs the proxy until stdin closes; `take` on stdin prints the tally as JSON."""
    CountingProxy.upstream = upstream
    CountingProxy.tally = Tally()
    server = ThreadingHTTPServer(("127.0.0.1", 0), CountingProxy)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    for line in sys.stdin:
        if line.strip() == "take":
            print(json.dumps(CountingProxy.tally.take()), flush=True)
    server.shutdown()


class Servers:
    """moto and the counting proxy, each a child process; the AWS_* variables point at the
    proxy (spawned ranks inherit them)."""

    def __init__(self):
        moto_server = os.path.join(REPO, "tests/s3/moto_server.py")
        self.moto = subprocess.Popen([sys.executable, moto_server], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        moto_port = int(self.moto.stdout.readline().split()[0])
        self.proxy = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--proxy",
                                       str(moto_port)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.endpoint = f"http://127.0.0.1:{int(self.proxy.stdout.readline())}"
        for k in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
            os.environ.pop(k, None)
        os.environ.update({"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
                           "AWS_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint})
        self.client = boto3_client(self.endpoint, 16)
        self.client.create_bucket(Bucket=BUCKET)

    def take(self) -> dict:
        self.proxy.stdin.write("take\n")
        self.proxy.stdin.flush()
        return json.loads(self.proxy.stdout.readline())

    def objects(self, prefix: str) -> list[tuple[str, int]]:
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                           Prefix=prefix):
            out += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
        return out

    def remove(self, prefix: str) -> None:
        keys = [k for k, _ in self.objects(prefix)]
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=BUCKET, Delete={
                "Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})
        for up in self.client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get(
                "Uploads", []):
            self.client.abort_multipart_upload(Bucket=BUCKET, Key=up["Key"],
                                               UploadId=up["UploadId"])

    def close(self) -> None:
        for p in (self.proxy, self.moto):
            p.stdin.close()
        for p in (self.proxy, self.moto):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def boto3_client(endpoint: str, connections: int):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                        config=Config(max_pool_connections=max(connections, 10),
                                      s3={"addressing_style": "path"}))


# ------------------------------------------------------------------ state --

def pattern(first: int, count: int):
    """Int64 words [first, first + count) of the state's bytes: a mixing function of the
    index, so any rank rebuilds any tensor."""
    import torch
    x = torch.arange(first, first + count, dtype=torch.int64) * 0x5851F42D4C957F2D
    return x ^ (x >> 29)


def tensor_spec(i: int):
    import torch
    return (torch.float32, (ROWS, 2048)) if i % 2 == 0 else (torch.bfloat16, (ROWS, 4096))


def key(i: int) -> str:
    return f"layers.{i:03d}.{'w' if i % 2 == 0 else 'w_bf16'}"


def tensor_of(i: int):
    dtype, shape = tensor_spec(i)
    words = TENSOR_BYTES // 8
    return pattern(i * words, words).view(dtype).view(shape)


def state_over(flat, n: int) -> dict:
    """The state's n tensors, views of the bytes `flat`."""
    out = {}
    for i in range(n):
        dtype, shape = tensor_spec(i)
        out[key(i)] = flat[i * TENSOR_BYTES:(i + 1) * TENSOR_BYTES].view(dtype).view(shape)
    return out


def same_bytes(a, b) -> bool:
    import torch
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ---------------------------------------------------------------- systems --

def dcp_s3tc(endpoint: str, path: str, threads: int = 0):
    """A writer (threads > 0) or reader of s3torchconnector's DCP integration. Its DCP
    classes take no endpoint, so the file system is given a client that has one."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
    from s3torchconnector.dcp.s3_file_system import S3FileSystem
    cfg = S3ClientConfig(part_size=PART, force_path_style=True)
    client = S3Client(REGION, endpoint=endpoint, s3client_config=cfg)
    if threads:
        io_ = S3StorageWriter(REGION, path, s3client_config=cfg, thread_count=threads)
        io_.fs = S3FileSystem(REGION, s3_client=client)
    else:
        io_ = S3StorageReader(REGION, path, s3client_config=cfg)
        io_.fs = S3FileSystem(REGION, s3_client=client, reader_constructor=io_._reader_constructor)
    return io_


def dcp_fsspec(endpoint: str, path: str, threads: int = 0):
    """A writer (threads > 0) or reader of DCP over fsspec / s3fs. sync_files=False: an
    upload is durable once complete, and DCP's fallback for s3fs files is os.sync()."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    opts = dict(endpoint_url=endpoint, key=KEY_ID, secret=SECRET,
                client_kwargs={"region_name": REGION},
                config_kwargs={"s3": {"addressing_style": "path"}}, default_block_size=PART)
    if threads:
        return FsspecWriter(path, thread_count=threads, sync_files=False, **opts)
    return FsspecReader(path, **opts)


DCP = {"s3torchconnector": dcp_s3tc, "fsspec/s3fs": dcp_fsspec}


class MemFile(io.RawIOBase):
    """A seekable, writable file over a memoryview: the target of a raw download."""

    def __init__(self, view):
        self.view, self.pos = view, 0

    def seekable(self):
        return True

    def writable(self):
        return True

    def seek(self, offset, whence=0):
        self.pos = offset + (self.pos if whence == 1 else len(self.view) if whence == 2 else 0)
        return self.pos

    def tell(self):
        return self.pos

    def write(self, b):
        n = len(b)
        self.view[self.pos:self.pos + n] = b
        self.pos += n
        return n


def transfer_manager(client, concurrency: int):
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    return create_transfer_manager(client, TransferConfig(
        multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=concurrency,
        use_threads=True, preferred_transfer_client="classic"))


# -------------------------------------------------------------- resharded --

def reshard_worker(rank: int, world: int, init_file: str, out_file: str, job: dict) -> None:
    """One rank of a resharded load: DTensor targets placed Shard(job['dim']) on a 1-D mesh,
    loaded by job['system'] from job['path'] between barriers, then checked."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import shardsafe
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(minutes=30))
    try:
        mesh = init_device_mesh("cpu", (world,))
        target = {}
        for i in range(job["tensors"]):
            dtype, shape = tensor_spec(i)
            target[key(i)] = distribute_tensor(torch.zeros(shape, dtype=dtype), mesh,
                                               [Shard(job["dim"])])
        needed = sum(t.to_local().nbytes for t in target.values())
        dist.barrier()
        t0 = time.perf_counter()
        bytes_read = 0
        if job["system"] == "shardsafe":
            bytes_read = shardsafe.load(target, job["path"]).bytes_read
        else:
            dcp.load(target, storage_reader=DCP[job["system"].removeprefix("DCP ")](
                job["endpoint"], job["path"]))
        dist.barrier()
        seconds = time.perf_counter() - t0
        wrong = [k for i, (k, t) in enumerate(target.items()) if not same_bytes(
            t.to_local(), tensor_of(i).tensor_split(world, job["dim"])[rank])]
        sums = torch.tensor([needed, bytes_read, len(wrong)], dtype=torch.int64)
        dist.all_reduce(sums)
        if rank == 0:
            with open(out_file, "w") as f:
                json.dump({"seconds": seconds, "needed": int(sums[0]), "engine_read": int(sums[1]),
                           "wrong": int(sums[2])}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_reshard(job: dict) -> dict:
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        mp.spawn(reshard_worker, args=(job["world"], os.path.join(d, "init"), out, job),
                 nprocs=job["world"], join=True)
        with open(out) as f:
            return json.load(f)


# ------------------------------------------------------------------ bench --

SAVE, LOAD = "save", "load"
RESHARDS = (("resharded load, 2 ranks, columns", 2, 1), ("resharded load, 3 ranks, rows", 3, 0))


class Bench:
    def __init__(self, args, servers: Servers):
        import torch
        self.args, self.s = args, servers
        self.n = max(2, round(args.size_mib * MIB / TENSOR_BYTES))
        self.flat = pattern(0, self.n * TENSOR_BYTES // 8).view(torch.uint8)
        self.state = state_over(self.flat, self.n)
        self.target_flat = torch.zeros_like(self.flat)  # loads land here, zeroed before each
        self.target = state_over(self.target_flat, self.n)
        # (objects, system, op) -> {"label": ..., "reps": [...]}, in measurement order
        self.rows: dict[tuple, dict] = {}
        self.data = {}  # objects -> (data files, data bytes) of shardsafe's checkpoint

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def measure(self, at: tuple, label: str, fn) -> None:
        """Runs fn() timed, with the proxy's tally of its requests; records it under `at`
        (objects, system, op), or the error that stopped it, as one line."""
        gc.collect()
        self.s.take()
        self.target_flat.zero_()
        t0 = time.perf_counter()
        try:
            extra = fn() or {}
            error = None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a peer that cannot run is reported, not fatal (DCP's
            # CheckpointException derives from BaseException)
            extra, error = {}, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            traceback.print_exc(file=sys.stderr)
        seconds = time.perf_counter() - t0
        tally = self.s.take()
        rec = {"seconds": extra.pop("seconds", seconds), "tally": tally, "error": error, **extra}
        self.rows.setdefault(at, {"label": label, "reps": []})["reps"].append(rec)
        self.log(f"[{at[0]} obj] {label}: " + (
            f"FAILED {error}" if error else
            f"{rec['seconds']:.2f} s, {sum(tally['requests'].values())} requests, "
            f"{(tally['up'] + tally['down']) / MIB:.0f} MiB"))

    def check_target(self, what: str) -> None:
        if not same_bytes(self.target_flat, self.flat):
            raise AssertionError(f"{what}: the loaded bytes differ from the state's")

    def rep(self, r: int) -> None:
        """Per layout: every system's save, then every load, then the resharded loads, so
        that the rows compared run a few seconds apart (this machine's speed drifts)."""
        for k in self.args.objects:
            raw = RawObjects(self, r, k)
            ss = f"s3://{BUCKET}/shardsafe/{k}/rep{r}"
            dcps = {n: f"s3://{BUCKET}/dcp-{n.split('/')[0]}/{k}/rep{r}" for n in DCP}
            raw.upload()
            self.shardsafe_save(k, ss)
            for name, path in dcps.items():
                self.dcp_save(k, name, path)
            raw.download()
            self.shardsafe_load(k, ss)
            for name, path in dcps.items():
                self.dcp_load(k, name, path)
            if not self.args.no_reshard and k == self.args.objects[0]:
                self.reshards(k, "shardsafe", ss, RESHARDS)
                for name, path in dcps.items():
                    self.reshards(k, f"DCP {name}", path, RESHARDS[:1])
            self.s.remove("")

    def reshards(self, k: int, system: str, path: str, which) -> None:
        for op, world, dim in which:
            self.measure((k, system, op), f"{system} {op}", lambda w=world, d=dim: checked(
                run_reshard({"system": system, "path": path, "world": w, "dim": d,
                             "tensors": self.n, "endpoint": self.s.endpoint})))

    def shardsafe_save(self, k: int, path: str) -> None:
        """Saved with a payload cap per data file that makes k of them (one is the default
        up to 2 GiB)."""
        import shardsafe
        cap = {} if k == 1 else {"max_file_bytes": math.ceil(len(self.flat) / k)}
        self.measure((k, "shardsafe", SAVE), "shardsafe save" + (
            f", max_file_bytes {cap['max_file_bytes']}" if cap else ""),
            lambda: shardsafe.save(self.state, path, **cap) and {})
        data = [n for key_, n in self.s.objects(path[len(f"s3://{BUCKET}/"):] + "/")
                if DATA_OBJECT.search(key_)]
        self.data[k] = (len(data), sum(data))

    def shardsafe_load(self, k: int, path: str) -> None:
        import shardsafe

        def load():
            res = shardsafe.load(self.target, path)
            self.check_target("shardsafe load")
            return {"engine_read": res.bytes_read}
        self.measure((k, "shardsafe", LOAD), "shardsafe load", load)

    def dcp_save(self, k: int, name: str, path: str) -> None:
        """thread_count k: a file per thread."""
        import torch.distributed.checkpoint as dcp
        system = f"DCP {name}"
        self.measure((k, system, SAVE), f"{system} save, thread_count {k}", lambda: dcp.save(
            self.state, storage_writer=DCP[name](self.s.endpoint, path, k)) and {})

    def dcp_load(self, k: int, name: str, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        system = f"DCP {name}"

        def load():
            dcp.load(self.target, storage_reader=DCP[name](self.s.endpoint, path))
            self.check_target(f"{system} load")
        self.measure((k, system, LOAD), f"{system} load", load)


class RawObjects:
    """The state's bytes as k objects, up and down with s3transfer at shardsafe's
    concurrency: 4 parts in flight per file, 16 threads at most; 4 reads in flight."""

    def __init__(self, bench: Bench, r: int, k: int):
        self.b, self.k = bench, k
        self.bounds = [len(bench.flat) * j // k for j in range(k + 1)]
        self.keys = [f"raw/{k}/rep{r}/object-{j}" for j in range(k)]
        self.threads = min(UPLOAD_THREADS, UPLOADS_PER_FILE * k)
        self.client = boto3_client(bench.s.endpoint, max(self.threads, READS_IN_FLIGHT))

    def pieces(self, flat):
        view = memoryview(flat.numpy())
        return [view[a:b] for a, b in zip(self.bounds, self.bounds[1:])]

    def upload(self) -> None:
        bodies = [io.BytesIO(p) for p in self.pieces(self.b.flat)]

        def upload():
            with transfer_manager(self.client, self.threads) as tm:
                for f in [tm.upload(b, BUCKET, kk) for b, kk in zip(bodies, self.keys)]:
                    f.result()
        self.b.measure((self.k, "raw", SAVE), f"raw upload, s3transfer {self.threads} threads",
                       upload)

    def download(self) -> None:
        def download():
            with transfer_manager(self.client, READS_IN_FLIGHT) as tm:
                for f in [tm.download(BUCKET, kk, MemFile(p))
                          for kk, p in zip(self.keys, self.pieces(self.b.target_flat))]:
                    f.result()
            self.b.check_target("raw download")
        self.b.measure((self.k, "raw", LOAD), f"raw download, s3transfer {READS_IN_FLIGHT} "
                       "threads", download)


def checked(res: dict) -> dict:
    wrong = res.pop("wrong")
    if wrong:
        raise AssertionError(f"{wrong} tensors loaded wrong on some rank")
    return res


# ----------------------------------------------------------------- report --

def summary(row: dict, state_bytes: int) -> dict:
    """Medians over reps: seconds, requests (all, to data objects), payload bytes moved (both
    ways) / state, bytes downloaded; the last rep's requests by method."""
    ok = [r for r in row["reps"] if not r["error"]]
    if not ok:
        return {"error": row["reps"][-1]["error"]}

    def med(f):
        return statistics.median(f(r) for r in ok)
    t = lambda r: r["tally"]  # noqa: E731
    return {"seconds": med(lambda r: r["seconds"]),
            "requests": med(lambda r: sum(t(r)["requests"].values())),
            "data_requests": med(lambda r: t(r)["data_requests"]),
            "by_method": t(ok[-1])["requests"],
            "moved": med(lambda r: t(r)["up"] + t(r)["down"]) / state_bytes,
            "down": med(lambda r: t(r)["down"]),
            "error": None if len(ok) == len(row["reps"]) else row["reps"][-1]["error"]}


def ratios(sm: dict, data: dict, state_bytes: int) -> list[tuple]:
    """(what, value, goal, met) for every target of the issue this run measured."""
    out = []

    def sec(at):
        return (sm.get(at) or {}).get("seconds")

    for k in sorted({at[0] for at in sm}):
        tag = f"[{k} object{'s' * (k > 1)}]"
        for op, raw_op in ((SAVE, "upload"), (LOAD, "download")):
            ours = sec((k, "shardsafe", op))
            if ours and sec((k, "raw", op)):
                v = sec((k, "raw", op)) / ours
                out.append((f"{tag} {op} speed / raw {raw_op}", v, f">= {TARGET_RAW}",
                            v >= TARGET_RAW))
        for op in (SAVE, LOAD, RESHARDS[0][0]):
            ours = sec((k, "shardsafe", op))
            for name in DCP:
                if ours and (k, f"DCP {name}", op) in sm:
                    peer = sec((k, f"DCP {name}", op))
                    v = peer / ours if peer else None
                    out.append((f"{tag} {op} speed / DCP {name}", v, f">= {TARGET_DCP}",
                                None if v is None else v >= TARGET_DCP))
        if k in data:
            files, nbytes = data[k]
            bound = math.ceil(nbytes / PART) + 4 * files
            for op in (SAVE, LOAD):
                for what, field in (("requests", "requests"),
                                    ("requests to data objects", "data_requests")):
                    if sec((k, "shardsafe", op)):
                        v = sm[(k, "shardsafe", op)][field]
                        out.append((f"{tag} {op}: {what} (ceil({nbytes} B / 16 MiB) + 4 x "
                                    f"{files} data files)", v, f"<= {bound}", v <= bound))
        for op, _, _ in RESHARDS:
            if sec((k, "shardsafe", op)):
                v = sm[(k, "shardsafe", op)]["down"] / state_bytes
                out.append((f"{tag} {op}: bytes read / needed", v, f"<= {TARGET_OVERREAD}",
                            v <= TARGET_OVERREAD))
    return out


def fmt_table(rows: dict, sm: dict, state_bytes: int) -> str:
    lines = ["| objects | row | s | MiB/s | speed vs raw | speed vs DCP s3torchconnector / fsspec "
             "| requests (to data objects; by method) | bytes moved / state | read / needed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for at, row in rows.items():
        k, system, op = at
        v = sm[at]
        if v.get("seconds") is None:
            lines.append(f"| {k} | {row['label']} | FAILED: {v['error']} | | | | | | |")
            continue
        s = v["seconds"]

        def speed(other):
            o = (sm.get(other) or {}).get("seconds")
            return f"{o / s:.2f}" if o else "-"
        vs_raw = speed((k, "raw", op)) if system != "raw" and op in (SAVE, LOAD) else ""
        vs_dcp = (" / ".join(speed((k, f"DCP {n}", op)) for n in DCP)
                  if system == "shardsafe" and op != RESHARDS[1][0] else "")
        methods = ", ".join(f"{m} {c}" for m, c in sorted(v["by_method"].items()))
        read = f"{v['down'] / state_bytes:.2f}" if op != SAVE else ""
        lines.append(f"| {k} | {row['label']} | {s:.2f} | {state_bytes / MIB / s:.0f} | {vs_raw} "
                     f"| {vs_dcp} | {v['requests']:.0f} ({v['data_requests']:.0f}; {methods}) | "
                     f"{v['moved']:.3f} | {read} |")
    return "\n".join(lines)


def fmt_targets(rs: list[tuple]) -> str:
    lines = ["| target | value | goal | met |", "|---|---|---|---|"]
    for what, v, goal, met in rs:
        val = "n/a" if v is None else f"{v:.0f}" if "requests" in what else f"{v:.2f}"
        lines.append(f"| {what} | {val} | {goal} | "
                     f"{'n/a' if met is None else 'yes' if met else 'NO'} |")
    return "\n".join(lines)


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version
    out = []
    for p in ("torch", "moto", "boto3", "s3transfer", "s3torchconnector", "s3fs"):
        try:
            out.append(f"{p} {version(p)}")
        except PackageNotFoundError:
            out.append(f"{p} missing")
    return ", ".join(out)


NOTES = (
    "moto keeps every object in one Python process, so these times measure each client's protocol "
    "overhead (requests, round trips, copies) against a server slower than any client, not "
    "storage speed; request and byte counts are the proxy's and do not depend on the server. "
    "moto answers every ranged GET by reading the whole object, one GET of an object at a time "
    "(FakeKey.value under a lock), so a load's time grows with object size x GETs: compare rows "
    "of one layout (objects column) only.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=512, help="state size (default 512)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--objects", default="1,4",
                    help="layouts, in objects per checkpoint (default 1,4); resharded loads "
                         "use the first")
    ap.add_argument("--no-reshard", action="store_true", help="skip the resharded loads")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--proxy", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.proxy:
        serve_proxy(args.proxy)
        return 0
    args.objects = [int(k) for k in args.objects.split(",")]
    started = time.time()
    servers = Servers()
    try:
        bench = Bench(args, servers)
        bench.log(f"state: {bench.n} tensors, {len(bench.flat) / MIB:.0f} MiB; "
                  f"endpoint {servers.endpoint} (proxy) in front of moto")
        for r in range(args.reps):
            bench.rep(r)
    finally:
        servers.close()
    state_bytes = len(bench.flat)
    sm = {at: summary(row, state_bytes) for at, row in bench.rows.items()}
    rs = ratios(sm, bench.data, state_bytes)
    renamed = sum(r["tally"]["renamed"] for row in bench.rows.values() for r in row["reps"])
    print(f"shardsafe on S3, moto on loopback: {state_bytes / MIB:.0f} MiB in {bench.n} tensors "
          f"(F32 [2048, 2048] / BF16 [2048, 4096]), {args.reps} rep(s), medians; shardsafe's "
          f"data objects (files, bytes) per layout: {bench.data}\n"
          f"{os.cpu_count()} cpus, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{versions()}\n")
    print(fmt_table(bench.rows, sm, state_bytes))
    print()
    print(fmt_targets(rs))
    print(f"\n{NOTES} The proxy renamed the root element of {renamed} CompleteMultipartUpload "
          f"answers to S3's CompleteMultipartUploadResult (moto 5.2 writes "
          f"CompleteMultipartUploadResponse, getmoto/moto#10055; s3torchconnector's CRT client "
          f"reads the ETag from it and fails without).")
    print(f"\nelapsed {(time.time() - started) / 60:.1f} min")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "state_bytes": state_bytes, "data": bench.data,
                       "rows": [{"at": at, **row, "summary": sm[at]}
                                for at, row in bench.rows.items()], "targets": rs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
