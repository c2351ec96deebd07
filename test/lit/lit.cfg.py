# lit configuration for nf: nf-opt / nfc driven FileCheck tests.
import os
import sys

import lit.formats

config.name = "nf"
config.test_format = lit.formats.ShTest(not lit_config.isWindows)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.nf_obj_root, "test", "lit")

config.environment["PATH"] = os.pathsep.join(
    [config.nf_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", os.environ["PATH"])]
)
# nfc --target=cuda needs NVRTC (the CUDA toolkit at configure time).
if getattr(config, "nf_have_nvrtc", False):
    config.available_features.add("nvrtc")
config.substitutions.append(("%fixtures", os.path.join(config.nf_test_data, "fixtures")))
config.substitutions.append(("%broken", os.path.join(config.nf_test_data, "broken")))
config.substitutions.append(("%examples", config.nf_examples))
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("%flatbuffers_schema", os.path.join(config.nf_src_root, "runtime", "schema", "plan.fbs")))
