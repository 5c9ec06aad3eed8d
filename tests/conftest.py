import os

# Keras picks its backend at import time; the test-suite's Keras tests use TensorFlow.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
