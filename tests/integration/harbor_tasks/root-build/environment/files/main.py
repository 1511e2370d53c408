import sys

sys.path.insert(0, "/app")
from generated import VALUE  # noqa: E402 - made by the image's python step

print("answer", VALUE + 1)
