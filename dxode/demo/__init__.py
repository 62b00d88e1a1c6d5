"""The ``dxode demo`` command and its Lorenz model."""
