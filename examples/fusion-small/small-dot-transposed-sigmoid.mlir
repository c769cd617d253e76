// A batched dot whose operands arrive transposed, with a sigmoid epilogue in f16
// (the transposes become -transA/-transB of the tuning key).
// RUN: rocmlir-opt -migraphx-to-tosa %s | rocmlir-driver -host-pipeline highlevel | rocmlir-gen -ph -print-results -rand 1 -fut dot_t - | rocmlir-driver -c | FileCheck %s

module {
  func.func @dot_t(%arg0: tensor<2x64x48xf16>, %arg1: tensor<2x40x64xf16>) -> tensor<2x48x40xf16> {
    %0 = migraphx.transpose(%arg0) {permutation = [0, 2, 1]} : (tensor<2x64x48xf16>) -> tensor<2x48x64xf16>
    %1 = migraphx.transpose(%arg1) {permutation = [0, 2, 1]} : (tensor<2x40x64xf16>) -> tensor<2x64x40xf16>
    %2 = migraphx.dot(%0, %1) : (tensor<2x48x64xf16>, tensor<2x64x40xf16>) -> tensor<2x48x40xf16>
    %3 = migraphx.sigmoid(%2) : (tensor<2x48x40xf16>) -> tensor<2x48x40xf16>
    return %3 : tensor<2x48x40xf16>
  }
}
