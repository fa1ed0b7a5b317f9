"""Generated protobuf and gRPC modules for the ``metaq.v1`` proto package.

Do not edit: change ``common/proto/metaq/v1/*.proto`` and run ``make generate``.
"""
