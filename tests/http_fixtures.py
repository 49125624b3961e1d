"""A real HTTP server on TCP or on a Unix socket: the stand-in adapter of the sandbox network tests."""

import http.server
import socket
import threading

REPLY = b"adapter says hi"


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(REPLY)))
        self.end_headers()
        self.wfile.write(REPLY)

    def log_message(self, *a):
        pass


class UnixHTTPServer(http.server.ThreadingHTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self):
        self.socket.bind(self.server_address)

    def get_request(self):
        conn, _ = self.socket.accept()
        return conn, ("sandbox", 0)


def serve(server):
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
