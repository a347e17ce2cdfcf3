"""downstream: the image works as a base: an image built FROM it pip-installs a package as the image's default user
(no USER root), and in a container run as an arbitrary uid `pip install --user` installs one too."""
import pytest

from .helpers import pip_error

pytestmark = pytest.mark.check("downstream")


def _fix(error: str) -> str:
    if "Permission denied" in error or "Read-only" in error or "outside the image environment" in error:
        return ("make /opt/venv owned by the image's user with group 0 and group-writable (COPY --chown=UID:0 and "
                "chmod -R g=u in the stage that builds it, not a chown layer that copies the venv)")
    if "User site-packages are not visible" in error:
        return ("pip refuses --user in a venv that hides user site-packages: create it with --system-site-packages "
                "(include-system-site-packages = true in pyvenv.cfg), so that ~/.local is on sys.path")
    if "No module named pip" in error or "no pip" in error:
        return "keep pip in the image's venv (python -m venv installs it; do not remove it)"
    return "run the same pip command in the image to see why"


def test_a_derived_image_pip_installs_as_the_default_user(facts, spec):
    result = facts["downstream"]
    user = result["user"] or "root (no USER)"
    error = pip_error(result["log"]) if "pip install" in result["error"] or not result["error"] else result["error"]
    assert result["ok"], (
        f"an image built FROM {spec.tag} could not pip-install a package as its user {user}: {error} (build error: "
        f"{result['error'][-300:]}); expected `RUN pip install --no-index WHEEL` to work without USER root: "
        f"{_fix(error)}")


def test_pip_install_user_under_an_arbitrary_uid(arbitrary_user, expect):
    result = arbitrary_user["user_install"]
    error = result.get("error") or pip_error(result.get("output", ""))
    assert result.get("ok"), (
        f"as `--user {expect['arbitrary_uid']}` (HOME={arbitrary_user['user']['home']}), `{result.get('step')}` "
        f"failed: {error}; expected `pip install --user WHEEL` and importing it to work: {_fix(error)}")
