//===- fsdp-ckpt.cpp - Command line over the checkpoint runtime -----------===//
#include "fsdp/Runtime/Inspect.h"

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char **argv) {
  CLI::App app{"fsdp-ckpt: inspect, save, load and verify DCP checkpoints"};
  app.require_subcommand(1);

  std::string inspectDir;
  fsdp::runtime::InspectOptions inspectOptions;
  CLI::App *inspect = app.add_subcommand(
      "inspect", "List the keys, shapes, dtypes, chunks and files of a DCP checkpoint");
  inspect->add_option("dir", inspectDir, "Checkpoint directory")->required();
  inspect->add_flag("--json", inspectOptions.json, "Print JSON");

  CLI11_PARSE(app, argc, argv);

  if (inspect->parsed()) {
    fsdp::Status status = fsdp::runtime::inspectCheckpoint(inspectDir, inspectOptions, std::cout);
    if (!status) {
      std::cerr << "fsdp-ckpt inspect: " << status.error() << "\n";
      return 1;
    }
  }
  return 0;
}
