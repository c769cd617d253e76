// A small conv + bias + relu fusion in the shape of rocMLIR's resnet50 fusion tests
// (mlir/test/fusion/e2e/resnet50), shrunk so the CPU tuner runs it in seconds.
// RUN: rocmlir-opt -migraphx-to-tosa %s | rocmlir-driver -host-pipeline partition,highlevel -targets %arch | rocmlir-gen -ph -verifier clone -fut test - | rocmlir-driver -host-pipeline xmodel -kernel-pipeline full | xmir-runner --entry-point-result=void | FileCheck %s --check-prefix=CLONE
// CLONE: [1 1 1]

module {
  func.func @test(%arg0: tensor<1x32x1x1xf32>, %arg1: tensor<1x16x14x14xf32>, %arg2: tensor<32x16x3x3xf32>) -> tensor<1x32x14x14xf32> {
    %0 = migraphx.multibroadcast(%arg0) {out_lens = [1, 32, 14, 14]} : (tensor<1x32x1x1xf32>) -> tensor<1x32x14x14xf32>
    %1 = migraphx.convolution(%arg1, %arg2) {dilation = [1, 1], group = 1 : i64, padding = [1, 1, 1, 1], padding_mode = 0 : i64, stride = [1, 1]} : (tensor<1x16x14x14xf32>, tensor<32x16x3x3xf32>) -> tensor<1x32x14x14xf32>
    %2 = migraphx.add(%1, %0) : (tensor<1x32x14x14xf32>, tensor<1x32x14x14xf32>) -> tensor<1x32x14x14xf32>
    %3 = migraphx.relu(%2) : (tensor<1x32x14x14xf32>) -> tensor<1x32x14x14xf32>
    return %3 : tensor<1x32x14x14xf32>
  }
}
