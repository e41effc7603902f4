
š
resnet-inference-7c9f8d6b5-a1	inferencen
tritond
nvidia.com/gpu(GPU-83955f41-c244-982f-bc33-fa153854553e(GPU-09fa7b97-f0a9-506a-6747-481098d4affd
p
resnet-inference-7c9f8d6b5-b2	inferenceD
triton:
nvidia.com/gpu(GPU-39906e22-3cb4-3d64-a157-e9421a5f0f25
I
resnet-inference-7c9f8d6b5-c3	inference
triton
nvidia.com/gpu3
n
bert-inference-5d4c3b2a1-x9	inferenceD
server:
nvidia.com/gpu(GPU-5fb9129c-6cf2-e790-0ce7-c8fb16de4b77
n
resnet-inference-6b5a4c3d2-s1stagingD
triton:
nvidia.com/gpu(GPU-6664c476-721d-645f-e9e4-35ff53b37d87