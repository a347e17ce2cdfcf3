"""Install one layer of /opt/venv inside a build step (stdlib only: it runs on the image's own Python).

The build fetches this file from the builder's build-input server, then runs it in the final stage, once per venv
layer (torchimages.build_inputs.layers): it reads pip's settings from the server and resolves the row's requirements
with pip (a dry run: metadata only, with this image's markers and installed distributions). The distributions of its
layer are then written without their dependencies: from a wheelhouse, the server unpacks the planned wheels as pip
would (unpack.py, natively, also for an emulated machine) and the image's tar extracts the stream, owned and timed
as it comes; from an index, the image's own pip installs them and this script gives what it wrote one owner, mode
g=u and one file time. Either way the same wheels give byte-identical layers. Everything it fetched (settings, CA
bundle) is deleted before the step ends: none of it reaches a layer."""
import argparse
import base64
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from fnmatch import fnmatchcase

TOKEN_HOST_SUFFIX = ".build-inputs.invalid"  # server.py's: the build's token comes as a no_proxy entry
PIP_FLAGS = ["--no-cache-dir", "--disable-pip-version-check", "--no-compile", "--progress-bar", "off"]


def normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def interpreter(venv):
    """The interpreter the venv's own pip script names (python3.11): pip writes it into the scripts it installs,
    as a plain `pip install` would. The venv's python where the venv was moved (the toolkit stage)."""
    with open(os.path.join(venv, "bin", "pip")) as handle:
        named = handle.readline()[2:].strip()
    return named if os.path.exists(named) else os.path.join(venv, "bin", "python")


def authorize(env):
    """Every request to the build-input server from now on carries the build's token (server.py), read from the
    predefined no_proxy build arg: in no layer, the history or the cache key."""
    entries = ",".join(env.get(name, "") for name in ("no_proxy", "NO_PROXY")).split(",")
    tokens = [entry[:-len(TOKEN_HOST_SUFFIX)] for entry in entries if entry.endswith(TOKEN_HOST_SUFFIX)]
    if not tokens:
        sys.exit("install_layer: no build-input token in no_proxy: build this Dockerfile with torchimages' builder")
    opener = urllib.request.build_opener()
    opener.addheaders = [("Authorization", "Basic " + base64.b64encode(f"build:{tokens[0]}".encode()).decode())]
    urllib.request.install_opener(opener)


def fetch_settings(url, workdir):
    """pip's configuration as the builder serves it; its CA bundle, when there is one, next to it; the planner."""
    urllib.request.urlretrieve(url + "/planner.zip", os.path.join(workdir, "planner.zip"))
    with urllib.request.urlopen(url + "/inputs.json", timeout=60) as response:
        inputs = json.load(response)
    ca_path = os.path.join(workdir, "ca-bundle.pem")
    if inputs.get("ca_bundle"):
        with open(ca_path, "w") as handle:
            handle.write(inputs["ca_bundle"])
    config = os.path.join(workdir, "pip.conf")
    with open(config, "w") as handle:
        handle.write(inputs["pip_conf"].replace("{ca_bundle}", ca_path))
    # pip's own bytecode would land in the layer (the image ships none): not written.
    return dict(os.environ, PIP_CONFIG_FILE=config, PYTHONDONTWRITEBYTECODE="1")


def plan(pip, requirements, env, workdir, flags=()):
    """What pip would install now: [(name as its metadata spells it, version, requested, the wheel's URL)]. The
    builder's pip plans (from planner.zip, on this venv's interpreter: this venv's markers and installed
    distributions)."""
    report = os.path.join(workdir, "plan.json")
    planner = dict(env, PYTHONPATH=os.path.join(workdir, "planner.zip"))
    subprocess.run(pip + ["install", *PIP_FLAGS, *flags, "--dry-run", "--report", report, *requirements],
                   env=planner, check=True)
    with open(report) as handle:
        return [(item["metadata"]["name"], item["metadata"]["version"], item.get("requested", False),
                 item["download_info"]["url"]) for item in json.load(handle)["install"]]


def served_names(url, chosen):
    """The file names of the chosen wheels when the build-input server serves every one of them (a wheelhouse
    build), else None (an index build: the image's pip fetches and installs them)."""
    prefix = url + "/wheels/"
    if not all(wheel_url.startswith(prefix) for _, _, _, wheel_url in chosen):
        return None
    return [urllib.parse.unquote(wheel_url[len(prefix):]) for _, _, _, wheel_url in chosen]


def script_template(python):
    """The console-script template of the venv's own pip (distlib's): the scripts are what it would write."""
    return subprocess.run([python, "-B", "-c", "import sys; from pip._vendor.distlib.scripts import ScriptMaker; "
                                         "sys.stdout.write(ScriptMaker.script_template)"],
                          check=True, capture_output=True, text=True).stdout


def extract_layer(url, names, chosen, venv, site, owner, file_time):
    """The server unpacks the planned wheels (what pip would write, owned, g=u, at file_time) into a tar stream;
    the image's tar extracts it as it arrives."""
    uid, gid = owner if owner[0] is not None else (0, 0)
    python = interpreter(venv)
    request = {"wheels": [[name, requested] for name, (_, _, requested, _) in zip(names, chosen, strict=True)],
               "venv": {"root": venv, "site": site, "interpreter": python, "uid": uid, "gid": gid,
                        "python": "{}.{}".format(*sys.version_info[:2]), "time": file_time,
                        "script_template": script_template(python)}}
    print("unpacking " + " ".join(f"{name}=={version}" for name, version, _, _ in chosen)
          + " from the build-input server, as pip would install them", flush=True)
    post = urllib.request.Request(url + "/layer.tar", data=json.dumps(request).encode(),
                                  headers={"Content-Type": "application/json"})
    tar = subprocess.Popen(["tar", "--extract", "--file=-", "--directory=/", "--numeric-owner", "--same-owner",
                            "--same-permissions", "--delay-directory-restore"], stdin=subprocess.PIPE)
    cut = None
    try:
        cut = receive_layer(url, post, tar.stdin)
    finally:
        tar.stdin.close()
        if tar.wait() != 0 and cut is None:
            raise subprocess.CalledProcessError(tar.returncode, ["tar", "--extract", "(the layer from the server)"])
    if cut is not None:  # what tar wrote is part of a layer: the step fails, so no image keeps it
        sys.exit("install_layer: the build-input server cut the layer short: " + cut)


def receive_layer(url, post, sink):
    """The layer's stream copied into sink; None once it ended as the server ends a whole layer (its last chunk),
    else why the server cut it short. A server's refusal before the stream exits here."""
    try:
        with urllib.request.urlopen(post, timeout=600) as response:
            shutil.copyfileobj(response, sink, 1 << 20)
        return None
    except urllib.error.HTTPError as error:
        sys.exit("install_layer: the build-input server wrote no layer: " + error.read().decode(errors="replace"))
    except http.client.IncompleteRead:
        try:
            with urllib.request.urlopen(url + "/layer-error", timeout=60) as response:
                return response.read(4096).decode(errors="replace").strip() or "(it said no more)"
        except (OSError, http.client.HTTPException) as error:
            return f"(and could not be asked why: {error})"


def forget_request(site, names):
    """pip marks what it was asked for by name as REQUESTED; a dependency installed on its own with --no-deps is not
    one. Remove the marker and its RECORD line, so the dist-info is what a whole install writes."""
    for entry in os.listdir(site):
        if not entry.endswith(".dist-info") or normalise(entry.split("-")[0]) not in names:
            continue
        marker = os.path.join(site, entry, "REQUESTED")
        if os.path.exists(marker):
            os.remove(marker)
            record = os.path.join(site, entry, "RECORD")
            with open(record, newline="") as handle:  # pip's RECORD lines end in CRLF: kept
                lines = [line for line in handle if not line.startswith(entry + "/REQUESTED,")]
            with open(record, "w", newline="") as handle:
                handle.writelines(lines)


def normalise_new(root, since_ns, owner, file_time):
    """Owner, mode g=u and one modification time for what this step wrote (its status changed after since_ns):
    files of earlier layers are not touched, so they are not copied up into this one. Bytecode a package's install
    compiled goes first (the image ships none; removing it would change its folder's time again)."""
    for folder, dirs, _ in os.walk(root):
        if "__pycache__" in dirs and os.lstat(os.path.join(folder, "__pycache__")).st_ctime_ns > since_ns:
            shutil.rmtree(os.path.join(folder, "__pycache__"))
            dirs.remove("__pycache__")
    uid, gid = owner
    _fix(root, since_ns, uid, gid, file_time)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            _fix(os.path.join(folder, name), since_ns, uid, gid, file_time)


def _fix(path, since_ns, uid, gid, file_time):
    status = os.lstat(path)
    if status.st_ctime_ns <= since_ns:
        return
    if uid is not None:
        os.lchown(path, uid, gid)
    if not os.path.islink(path):
        mode = status.st_mode & 0o7777
        os.chmod(path, (mode & ~0o070) | ((mode & 0o700) >> 3))
    os.utime(path, (file_time, file_time), follow_symlinks=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", required=True, help="the build-input server's URL")
    parser.add_argument("--venv", required=True)
    parser.add_argument("--site", help="the venv's site-packages")
    parser.add_argument("--target", help="install the requirements alone into this folder (pip --target) instead")
    parser.add_argument("--uninstall-replaced", action="store_true",
                        help="only uninstall what the requirements would replace (the venv's own setuptools)")
    parser.add_argument("--dist", action="append", default=[], help="this layer's name patterns; none: all that is left")
    parser.add_argument("--owner", default="", help="UID:GID of what reaches the venv (empty: root's)")
    parser.add_argument("--time", type=int, required=True, help="every written path's modification time")
    parser.add_argument("requirements", nargs="+")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="torchimages-")
    try:
        since_ns = os.stat(workdir).st_ctime_ns
        authorize(os.environ)
        env = fetch_settings(args.inputs, workdir)
        pip = [interpreter(args.venv), "-m", "pip"]
        if args.uninstall_replaced:
            # A later layer would replace these: uninstalled here, they are in no layer beneath it as dead weight.
            names = [name for name, _, _, _ in plan(pip, args.requirements, env, workdir)]
            subprocess.run(pip + ["uninstall", "--yes", "--quiet", *names], env=env, check=True)
            return
        if args.target:
            pinned = plan(pip, args.requirements, env, workdir, ["--no-deps", "--ignore-installed"])
            subprocess.run(pip + ["install", *PIP_FLAGS, "--no-deps", "--target", args.target,
                                  *[f"{name}=={version}" for name, version, _, _ in pinned]], env=env, check=True)
            return
        chosen = [item for item in plan(pip, args.requirements, env, workdir)
                  if not args.dist or any(fnmatchcase(normalise(item[0]), pattern) for pattern in args.dist)]
        owner = tuple(int(part) for part in args.owner.split(":")) if args.owner else (None, None)
        names = served_names(args.inputs, chosen)
        if chosen and names is not None:
            extract_layer(args.inputs, names, chosen, args.venv, args.site, owner, args.time)
            return
        if chosen:
            # The image's own pip installs from the index (its files are what a whole install writes), each pinned.
            subprocess.run(pip + ["install", *PIP_FLAGS, "--no-deps", *[f"{name}=={version}" for name, version, _, _ in chosen]],
                           env=env, check=True)
            forget_request(args.site, {normalise(name) for name, _, requested, _ in chosen if not requested})
        normalise_new(args.venv, since_ns, owner, args.time)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        # This script, pip's downloads and the work folder were in the temporary folder, whose time the layer would
        # keep: the fixed time instead, so the same wheels give the same layer.
        os.remove(__file__)
        os.utime(tempfile.gettempdir(), (args.time, args.time))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as error:
        sys.exit(f"install_layer: pip {' '.join(error.cmd[3:5])} exited {error.returncode} (pip said why, above)")
