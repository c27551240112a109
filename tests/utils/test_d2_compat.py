"""largedet only asks whether detectron2._C is present: it installs nothing in Detectron2.

Each case runs in a fresh interpreter on a stand-in ``detectron2`` package, so that what
``import largedet`` does to it is seen from the start.
"""

import subprocess
import sys
import textwrap

import pytest

import largedet


def _run_with_stand_in(tmp_path, compiled_extension: str, checks: str) -> None:
    """Run ``checks`` after ``import largedet``, with a stand-in ``detectron2`` package first on
    the path whose ``_C.py`` holds ``compiled_extension`` (no ``_C`` at all if None)."""
    package = tmp_path / "stand_in" / "detectron2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if compiled_extension is not None:
        (package / "_C.py").write_text(compiled_extension)
    code = f"import sys\nsys.path.insert(0, {str(package.parent)!r})\nimport largedet\n" + textwrap.dedent(checks)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_a_missing_extension_is_reported_and_left_missing(tmp_path):
    _run_with_stand_in(
        tmp_path,
        None,
        """
        import detectron2
        assert largedet.HAS_COMPILED_D2_OPS is False
        assert "detectron2._C" not in sys.modules and not hasattr(detectron2, "_C")
        try:
            from detectron2 import _C
        except ImportError:
            pass
        else:
            raise AssertionError("detectron2._C imports after import largedet")
        import torch
        assert not hasattr(torch.ops.detectron2, "nms_rotated")
        """,
    )


def test_an_extension_that_fails_to_load_is_left_failing(tmp_path):
    """A compiled extension built for another Python or torch fails with ImportError or OSError."""
    _run_with_stand_in(
        tmp_path,
        "raise OSError('undefined symbol: _ZN3c10')\n",
        """
        assert largedet.HAS_COMPILED_D2_OPS is False
        assert "detectron2._C" not in sys.modules
        try:
            import detectron2._C
        except OSError as e:
            assert "undefined symbol" in str(e)
        else:
            raise AssertionError("detectron2._C imports after import largedet")
        """,
    )


def test_a_working_extension_is_reported_and_left_alone(tmp_path):
    _run_with_stand_in(
        tmp_path,
        "REAL = True\n",
        """
        assert largedet.HAS_COMPILED_D2_OPS is True
        import detectron2._C as ext
        assert ext.REAL and ext.__file__.endswith("_C.py")
        """,
    )


def test_no_detectron2_at_all(monkeypatch):
    from largedet.utils.d2_compat import has_compiled_detectron2_ops

    monkeypatch.setitem(sys.modules, "detectron2", None)  # import detectron2 raises ImportError
    assert has_compiled_detectron2_ops() is False


@pytest.mark.skipif(largedet.HAS_COMPILED_D2_OPS, reason="a compiled Detectron2 is installed")
def test_detectron2_without_its_extension_names_it():
    """Detectron2's own message where an op needs the extension, unchanged by largedet."""
    from detectron2.layers import DeformConv

    with pytest.raises(ImportError, match=r"detectron2\._C"):
        DeformConv(4, 6, kernel_size=3)
