# -*- Python -*-
# Runs every GoogleTest executable under <build>/unittests, one lit test per
# GoogleTest case, so the unit tests count in the same summary as lit's.
import os

import lit.formats

config.name = "FSDP-Unit"
config.suffixes = []
config.test_source_root = os.path.join(config.fsdp_obj_root, "unittests")
config.test_exec_root = config.test_source_root
config.test_format = lit.formats.GoogleTest(".", "Tests")
