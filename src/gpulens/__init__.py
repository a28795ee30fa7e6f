"""gpulens: how did my execution use the hardware?"""

__version__ = "0.1.0"
