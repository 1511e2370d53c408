import sys

sys.path.insert(0, "/app")
from generated import VALUE

print("answer", VALUE + 1)
