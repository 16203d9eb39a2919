"""Frigate's ``zmq`` detector protocol (``server``); its [zmq] keys (``settings``)."""
