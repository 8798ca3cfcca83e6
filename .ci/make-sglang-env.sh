#!/usr/bin/env bash
# Build a light CPU virtual environment holding real SGLang VERSION, eagle_gate
# (editable) and the test tools. Usage: .ci/make-sglang-env.sh VERSION VENV_DIR
#
# Why "light": `pip install sglang==X` pulls CUDA torch and GPU kernels (11 GB,
# and 0.5.9's scheduler still cannot import without libcuda). Instead we install
# the CPU torch wheel, SGLang's import-time dependencies, then sglang --no-deps,
# and a stand-in `sgl_kernel` (ci/sgl_kernel_stub) that SGLang imports on CPU.
# ci/cpu_spec adds, for tests only, what SGLang's speculative path needs on CPU.
set -euo pipefail
version="$1"; venv="$2"
here="$(cd "$(dirname "$0")/.." && pwd)"

python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q torch==2.13.0

common=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec
  pydantic pyzmq tqdm ipython aiohttp huggingface-hub setproctitle triton dill
  einops gguf partial-json-parser fastapi safetensors uvloop jsonschema
  python-multipart soundfile prometheus-client interegular llguidance
  pytest pytest-mock pytest-timeout ruff setuptools)
case "$version" in
  0.5.9)
    extra=("uvicorn" transformers==4.57.1 tokenizers sentencepiece openai==2.6.1
      xgrammar==0.1.27 compressed-tensors) ;;
  0.5.23)
    extra=("uvicorn>=0.51" apache-tvm-ffi==0.1.11 transformers==5.19.0
      tokenizers==0.23.2 sentencepiece==0.2.1 compressed-tensors==0.18.0
      openai==2.8.0 xgrammar==0.2.7
      # sglang.bench_serving imports datasets; the bench tool runs end to end
      # here (0.5.9's would need a huggingface-hub its transformers refuses)
      datasets) ;;
  *) echo "unsupported SGLang version for CI: $version" >&2; exit 2 ;;
esac
"$py" -m pip install -q "${common[@]}" "${extra[@]}" "torch==2.13.0"
"$py" -m pip install -q --no-deps "sglang==$version" torchvision==0.28.0
# The stand-in sgl_kernel goes into site-packages so every spawned SGLang
# process finds it, exactly as it would find the real one.
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$site/sgl_kernel"
cp -r "$here/ci/sgl_kernel_stub/sgl_kernel" "$site/sgl_kernel"
# torchvision's compiled ops do not load beside CPU torch; see the module doc.
cp "$here/ci/site/eagle_gate_ci_torchvision.py" "$here/ci/site/eagle_gate_ci_torchvision.pth" "$site/"
# CPU stand-ins that let SGLang's real EAGLE-3 path serve on CPU; inert unless
# EAGLE_GATE_CI_SPEC=1 (see ci/cpu_spec/eagle_gate_ci_spec/__init__.py). Every
# process imports the package from this checkout: the .pth names its folder
# (a path line, computed here, wherever the checkout is), then imports it, so
# edits under ci/cpu_spec take effect without rebuilding the environment.
rm -rf "$site/eagle_gate_ci_spec.py" "$site/eagle_gate_ci_spec"
printf '%s\nimport eagle_gate_ci_spec\n' "$here/ci/cpu_spec" >"$site/eagle_gate_ci_spec.pth"
"$py" -m pip install -q -e "$here[test]"
"$py" -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
