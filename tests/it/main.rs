mod vision;
