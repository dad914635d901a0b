"""The package's version: the components image's tag and the image the compiled YAML names
(``common.component.components_image``); ``setup.cfg`` reads it (``attr:``), so it is written
once."""

__version__ = "0.1.0"
