#!/usr/bin/env python3
"""A cloakd client in Python (grpcio): a mobile client, or an LBS provider, over TLS with a bearer token.

Stubs are generated at start from the repository's proto/ with grpcio-tools (no system protoc), so the
client always speaks the contract of the daemon next to it:

    pip install grpcio grpcio-tools

Mobile client (streams one request and prints every event until its reply or an end):

    python3 examples/python/location_client.py --target localhost:7443 --ca ca.crt \
        --token-file mobile.token --user alice --lat 53.14 --lon 8.21 --k 2

Asking the POI provider (`cloakd provider`, docs/provider.md) for the nearest cafe: the request carries a
cloakd.v1.poi.PoiQuery, the reply a candidate list for the whole cloaking box, from which the client picks
its exact answer with its own point (refine() below; nothing about the point leaves the client but the
request to the broker):

    python3 examples/python/location_client.py --target localhost:7443 --ca ca.crt \
        --token-file mobile.token --user alice --lat 53.14 --lon 8.21 --k 2 --poi nearest:cafe:1

Provider (subscribes to a service and answers every cloaked request with a fixed payload):

    python3 examples/python/location_client.py --target localhost:7443 --ca ca.crt \
        --token-file provider.token --provider poi --answer "no restaurants here"

Without --ca the connection is plaintext (only for a daemon on loopback with its embedded defaults).
The token is read from a file (or CLOAKD_TOKEN), never from the command line, so it stays out of the
process list and shell history.
"""
import argparse
import math
import os
import pathlib
import queue
import sys
import tempfile

import grpc
from grpc_tools import protoc

REPO = pathlib.Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "proto"


def load_stubs():
    """Compiles cloakd/v1/location.proto and poi.proto into a temporary package and imports them."""
    out = tempfile.mkdtemp(prefix="cloakd-stubs-")
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    status = protoc.main(
        [
            "protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(PROTO_DIR / "cloakd" / "v1" / "location.proto"),
            str(PROTO_DIR / "cloakd" / "v1" / "poi.proto"),
        ]
    )
    if status != 0:
        sys.exit(f"cannot compile {PROTO_DIR}/cloakd/v1/*.proto (protoc exit {status})")
    sys.path.insert(0, out)
    from cloakd.v1 import location_pb2, location_pb2_grpc, poi_pb2  # noqa: E402

    return location_pb2, location_pb2_grpc, poi_pb2


EARTH_RADIUS_M = 6_371_008.8


def haversine_m(lat1, lon1, lat2, lon2):
    """Great-circle distance in metres, as the provider measures it."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(a)))


def refine(candidates, lat, lon, kind, value):
    """The exact answer among the candidates for the point: nearest `value` (ties by id), or every
    candidate within `value` metres; nearest first, as (distance_m, poi)."""
    ranked = sorted(((haversine_m(lat, lon, p.lat, p.lon), p.id.encode(), p) for p in candidates), key=lambda r: r[:2])
    if kind == "nearest":
        ranked = ranked[: int(value)]
    else:
        ranked = [r for r in ranked if r[0] <= float(value)]
    return [(d, p) for d, _, p in ranked]


def poi_query(poi_pb, spec):
    """`nearest:CATEGORY:N` or `range:CATEGORY:METRES` as (PoiQuery, kind, value)."""
    try:
        kind, category, value = spec.split(":")
        if kind == "nearest":
            return poi_pb.PoiQuery(category=category, nearest=poi_pb.Nearest(count=int(value))), kind, value
        if kind == "range":
            return poi_pb.PoiQuery(category=category, range=poi_pb.Range(radius_m=float(value))), kind, value
    except ValueError:
        pass
    sys.exit(f"--poi: {spec!r} is not nearest:CATEGORY:N or range:CATEGORY:METRES")


def read_token(path):
    if path:
        token = pathlib.Path(path).read_text().strip()
    else:
        token = os.environ.get("CLOAKD_TOKEN", "").strip()
    return token or None


def open_channel(args):
    if args.ca:
        root = pathlib.Path(args.ca).read_bytes()
        credentials = grpc.ssl_channel_credentials(root_certificates=root)
        options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
        return grpc.secure_channel(args.target, credentials, options=options)
    return grpc.insecure_channel(args.target)


def run_mobile(args, pb, stubs, metadata, poi_pb):
    broker = stubs.LocationBrokerStub(open_channel(args))
    outbox = queue.Queue()
    query = poi_query(poi_pb, args.poi) if args.poi else None
    payload = query[0].SerializeToString() if query else args.query.encode()
    outbox.put(
        pb.LocationRequest(
            user_id=args.user,
            request_no=1,
            lat=args.lat,
            lon=args.lon,
            k=args.k,
            dx_m=args.dx_m,
            dy_m=args.dy_m,
            dt_ms=args.dt_ms,
            payload=payload,
            service=args.service,
        )
    )

    def requests():
        while True:
            item = outbox.get()
            if item is None:
                return
            yield item

    try:
        for event in broker.Submit(requests(), metadata=metadata, timeout=args.timeout):
            kind = event.WhichOneof("outcome")
            if kind == "reply" and query:
                candidates = poi_pb.PoiCandidates.FromString(event.reply.payload)
                if candidates.overloaded:
                    print(f"the provider is overloaded, ask again later: {candidates.error}", flush=True)
                elif candidates.error:
                    print(f"the provider refused the query: {candidates.error}", flush=True)
                else:
                    print(f"{len(candidates.pois)} candidates for the cloaking box; the answer here:", flush=True)
                    for distance, p in refine(candidates.pois, args.lat, args.lon, query[1], query[2]):
                        print(f"  {distance:8.1f} m  {p.name} ({p.category}, {p.id})", flush=True)
            else:
                print(kind, getattr(event, kind), flush=True)
            if kind in ("reply", "expired", "rejected", "undelivered"):
                outbox.put(None)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            sys.exit(f"Submit failed: {err.code().name}: {err.details()}")


def run_provider(args, pb, stubs, metadata):
    channel = open_channel(args)
    gateway = stubs.LbsGatewayStub(channel)
    answers = queue.Queue()

    def outgoing():
        while True:
            item = answers.get()
            if item is None:
                return
            yield item

    summary = gateway.Answer.future(outgoing(), metadata=metadata)
    served = 0
    try:
        stream = gateway.Subscribe(
            pb.LbsSubscription(service=args.provider), metadata=metadata, timeout=args.timeout
        )
        for cloaked in stream:
            box = cloaked.box
            print(
                f"cloaked request {cloaked.pseudonym}: box [{box.min_lat:.5f}, {box.min_lon:.5f}]"
                f" .. [{box.max_lat:.5f}, {box.max_lon:.5f}], payload {cloaked.payload!r}",
                flush=True,
            )
            answers.put(pb.LbsAnswer(pseudonym=cloaked.pseudonym, payload=args.answer.encode()))
            served += 1
            if args.count and served >= args.count:
                break
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            answers.put(None)
            sys.exit(f"Subscribe failed: {err.code().name}: {err.details()}")
    answers.put(None)
    result = summary.result()
    print(f"answers delivered {result.delivered}, undeliverable {result.undeliverable}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="host:port of cloakd")
    parser.add_argument("--ca", help="PEM file of the CA that issued the server certificate (TLS)")
    parser.add_argument("--server-name", help="name to verify in the server certificate, if not the host")
    parser.add_argument("--token-file", help="file holding the bearer token (default: $CLOAKD_TOKEN)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before giving up")
    parser.add_argument("--service", default="poi")
    parser.add_argument("--user", default="alice")
    parser.add_argument("--lat", type=float, default=53.14)
    parser.add_argument("--lon", type=float, default=8.21)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--dx-m", type=float, default=500.0)
    parser.add_argument("--dy-m", type=float, default=500.0)
    parser.add_argument("--dt-ms", type=int, default=30000)
    parser.add_argument("--query", default="restaurants near me")
    parser.add_argument("--poi", metavar="QUERY", help="ask the POI provider: nearest:CATEGORY:N or range:CATEGORY:METRES")
    parser.add_argument("--provider", metavar="SERVICE", help="act as a provider of SERVICE")
    parser.add_argument("--answer", default="answer from the python provider")
    parser.add_argument("--count", type=int, default=0, help="provider: stop after N requests")
    args = parser.parse_args()

    pb, stubs, poi_pb = load_stubs()
    token = read_token(args.token_file)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    if args.provider:
        run_provider(args, pb, stubs, metadata)
    else:
        run_mobile(args, pb, stubs, metadata, poi_pb)


if __name__ == "__main__":
    main()
