
T
train-0mlE
trainer:
nvidia.com/gpu(GPU-83955f41-c244-982f-bc33-fa153854553e
]
share-a	inferenceG
server=
nvidia.com/gpu+GPU-09fa7b97-f0a9-506a-6747-481098d4affd::0
]
share-b	inferenceG
server=
nvidia.com/gpu+GPU-09fa7b97-f0a9-506a-6747-481098d4affd::1

sneakydefault

notebook