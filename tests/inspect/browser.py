"""A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe):
no network port, no extra Python package. Requests and replies are JSON separated by NUL bytes
on file descriptors 3 (to the browser) and 4 (from it)."""
import json
import os
import select
import shutil
import subprocess
import tempfile
import time


class Browser:
    def __init__(self, width=1400, height=1000):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            raise RuntimeError("chromium is not installed (scripts/install-deps.sh installs it)")
        self.profile = tempfile.mkdtemp(prefix="qkv-chromium-")
        to_r, to_w = os.pipe()      # we write requests, the browser reads them on fd 3
        from_r, from_w = os.pipe()  # the browser writes replies on fd 4

        def child_fds():  # runs in the child between fork and exec
            a, b = os.dup2(to_r, 100), os.dup2(from_w, 101)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--proxy-server=127.0.0.1:9", "--hide-scrollbars", "about:blank"]
        self.proc = subprocess.Popen(args, close_fds=False, preexec_fn=child_fds,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self.w, self.r = to_w, from_r
        self.buf, self.next_id, self.events = b"", 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method, session=False, timeout=120, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.r], [], [], left)[0]:
                    raise TimeoutError(f"{method}: no reply from chromium in {timeout} s")
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"{method}: chromium closed the pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") != self.next_id:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply.get("result", {})

    def eval(self, expr, timeout=120):
        res = self.call("Runtime.evaluate", session=True, timeout=timeout, expression=expr,
                        returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page exception: {res['exceptionDetails']}")
        return res["result"].get("value")

    def open(self, path, timeout=120):
        """Loads a file and waits until the page sets body[data-ready]; returns seconds taken."""
        t0 = time.monotonic()
        self.call("Page.navigate", session=True, url="file://" + os.path.abspath(path))
        while time.monotonic() - t0 < timeout:
            if self.eval("document.body && document.body.dataset.ready === '1'"):
                return time.monotonic() - t0
            errors = [e for e in self.events if e.get("method") == "Runtime.exceptionThrown"]
            if errors:
                raise RuntimeError(f"page threw: {errors[0]['params']['exceptionDetails']}")
            time.sleep(0.05)
        raise TimeoutError(f"{path}: not ready in {timeout} s")

    def requested_urls(self):
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"]

    def mouse(self, x, y):
        self.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=x, y=y)

    def screenshot(self, path, clip=None):
        """Saves the viewport as PNG, or with clip = {x, y, width, height, scale} (page pixels)
        that rectangle of the page, scaled."""
        import base64
        extra = {} if clip is None else {"clip": clip, "captureBeyondViewport": True}
        data = self.call("Page.captureScreenshot", session=True, format="png", **extra)["data"]
        with open(path + ".tmp", "wb") as f:
            f.write(base64.b64decode(data))
        os.replace(path + ".tmp", path)

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.w)
        os.close(self.r)
        shutil.rmtree(self.profile, ignore_errors=True)
