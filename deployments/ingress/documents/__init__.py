"""Documents (PDF and text) read into a chat for any model: the stage, the bounded PDF workers, the cache."""
