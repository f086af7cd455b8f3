"""End-to-end tests: the whole local cluster driven through HAProxy by third-party clients.

A package, so that its modules (``tests.e2e.test_retained``) do not clash with unit test
modules of the same basename (``tests/unit`` is imported by basename).
"""
