"""The HTTP transport: the aiohttp app, its middleware, body limits and route tables."""
