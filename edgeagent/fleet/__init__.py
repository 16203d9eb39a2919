"""The wire protocol shared by device and hub: manifest, signing, trust, topics, MQTT link."""
