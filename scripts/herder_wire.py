"""Herder's client link for the measurement scripts: length-prefixed JSON frames (docs/PROTOCOL.md,
"Framing") and one connection that sends requests with fresh ids and reads their replies."""

import json
import socket
import struct
import time


def split(addr):
    """HOST:PORT -> (host, port)."""
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def frame(obj):
    body = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body


class Conn:
    """One client-link connection: requests with fresh ids, one reply read per request."""

    def __init__(self, addr):
        self.sock = socket.create_connection(split(addr), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.next_id = 1

    def recv_frame(self):
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack_from(">I", self.buf)[0]
                if len(self.buf) >= 4 + n:
                    body = bytes(self.buf[4:4 + n])
                    del self.buf[:4 + n]
                    return json.loads(body)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("coordinator closed the connection")
            self.buf += chunk

    def call(self, request):
        """Sends `request` with a fresh id; returns (sent, answered, reply) times and reply."""
        rid = self.next_id
        self.next_id += 1
        sent = time.time()
        self.sock.sendall(frame(dict(request, request_id=rid)))
        while True:
            reply = self.recv_frame()
            if reply.get("request_id") == rid:
                return sent, time.time(), reply
