
T
train-0mlE
trainer:
nvidia.com/gpu(GPU-a9df47ee-b6ab-c07a-6e63-fd1369c28af5
(
idx-0ml
main
nvidia.com/gpu1
]
mig-uuidserveJ
vllmB
nvidia.com/mig-3g.40gb(MIG-c07227be-dbd7-c909-00f5-6cbb3adde4d5
9
	mig-indexserve%
vllm
nvidia.com/mig-1g.10gb2:1
?
mig-gkeserve-
vllm%
nvidia.com/mig-1g.10gbnvidia2/gi3
g

mig-legacyserveR
vllmJ
nvidia.com/mig-1g.10gb0MIG-GPU-c69b5336-6a11-f54e-5f15-ee2bde1e8519/4/0
]
share-a	inferenceG
server=
nvidia.com/gpu+GPU-b7eb2f81-3329-de7d-0d6d-9cfeb04db5a5::0
]
share-b	inferenceG
server=
nvidia.com/gpu+GPU-b7eb2f81-3329-de7d-0d6d-9cfeb04db5a5::1
2
gke-0default 
app
nvidia.com/gpunvidia4
P
dra-0default>
app*7	gpu-claimdefault"!gpu.nvidia.comsim-node"gpu-5